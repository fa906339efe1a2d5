"""The recipe engine's pool planner (vLLM): GPU expert slots, KV, host pools and CPU sets for a host, and the plan
as the environment its entrypoint exports. Reads `inputs`, `routing` and `cache`."""
