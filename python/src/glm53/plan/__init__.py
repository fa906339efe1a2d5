"""The expert-pool planner: facts (checkpoint, host, profile, routing statistics) -> plan -> env.

Each module is one stage or one concept; every stage is a pure function over typed models and the readers sit
at the edges (`checkpoint_facts`, `traces`, `glm53.host`).
"""
