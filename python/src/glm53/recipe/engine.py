"""The engines glm53 serves with: the recipe's vLLM build and the public ExLlamaV3 + TabbyAPI."""

from __future__ import annotations

from typing import Literal

Engine = Literal["vllm", "exllamav3"]
ENGINES: tuple[Engine, ...] = ("vllm", "exllamav3")
DEFAULT_ENGINE: Engine = "vllm"


def engine_named(value: str) -> Engine:
    """The engine a profile's ENGINE value names; vllm when unset, as every profile before it was."""
    return next((engine for engine in ENGINES if engine == value), DEFAULT_ENGINE)
