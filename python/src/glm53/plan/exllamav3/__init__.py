"""The second engine's planner (ExLlamaV3 + TabbyAPI): the layer split and CPU experts, its routing captures, its
saved plans, and the GPU expert cache's sizing. Reads `inputs`, `routing` and `cache`; never `vllm`."""
