"""Serving: profiles, launch resolution (profile + plan + env -> argv, environment, affinity), exec, demo."""
