"""Serving: launch resolution (profile + plan + env -> argv, environment, affinity), preflight, exec, demo."""
