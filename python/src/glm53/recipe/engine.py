"""The engines glm53 serves with: the recipe's vLLM build and the public ExLlamaV3 + TabbyAPI."""

from __future__ import annotations

from typing import Literal

Engine = Literal["vllm", "exllamav3"]
ENGINES: tuple[Engine, ...] = ("vllm", "exllamav3")
