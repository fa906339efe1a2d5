"""Expert-cache simulation: hit curves in one pass, the policies engines run replayed step by step, their decode
cost, the per-layer slot split, and the recommendation that holds up against plain LRU. Reads `inputs` and
`routing`."""
