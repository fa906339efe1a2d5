"""The recipe's published performance: its measured points per profile and its agent-session figures.

Transcribed from the recipe's own benchmark tables into package data (`data/recipe-performance.json`);
`glm53 bench compare` reads them as the baseline and `glm53 fleet` sizes a fleet from them.
"""

from __future__ import annotations

import json
from importlib import resources

from pydantic import BaseModel


class RecipePoint(BaseModel):
    context_len: int
    output_tokens: int
    ttft_ms: float
    prefill_tok_s: float
    decode_tok_s: float


class RecipeAgent(BaseModel):
    profile: str
    tasks: int
    prefix_cache_hit_pct: float
    median_tool_call_turn_latency_s: float
    mean_decode_tok_s: float


class RecipePerformance(BaseModel):
    source: str
    method: str
    default_profile: str
    profiles: dict[str, list[RecipePoint]]
    agent: RecipeAgent


def recipe_performance() -> RecipePerformance:
    raw = resources.files("glm53").joinpath("data/recipe-performance.json").read_text(encoding="utf-8")
    return RecipePerformance.model_validate(json.loads(raw))


__all__ = ["RecipeAgent", "RecipePerformance", "RecipePoint", "recipe_performance"]
