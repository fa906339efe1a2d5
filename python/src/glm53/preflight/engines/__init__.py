"""The preflight part of each engine and its one registry: a third engine is one module here and one line in
PREFLIGHT_ENGINES (beside its line in `glm53.serve.engines`)."""

from __future__ import annotations

from glm53.preflight.engines.base import PreflightEngine
from glm53.preflight.engines.exllamav3 import EXLLAMAV3_PREFLIGHT
from glm53.preflight.engines.vllm import VLLM_PREFLIGHT
from glm53.recipe.engine import Engine

PREFLIGHT_ENGINES: dict[Engine, PreflightEngine] = {"vllm": VLLM_PREFLIGHT, "exllamav3": EXLLAMAV3_PREFLIGHT}


def preflight_engine(name: Engine) -> PreflightEngine:
    return PREFLIGHT_ENGINES[name]


__all__ = ["PREFLIGHT_ENGINES", "PreflightEngine", "preflight_engine"]
