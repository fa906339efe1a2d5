"""The recipe's facts: its serving profiles, the pins of repro.lock.json and its published performance.

Read by every stage after it (plan, preflight, serve, repro, bench, router); imports nothing of theirs.
"""
