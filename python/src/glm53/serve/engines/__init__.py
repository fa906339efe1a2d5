"""One seam per engine (`ServeEngine`, in `base`) and the one registry a launch picks its engine from, once.

A third engine is one module here that implements `ServeEngine` and one line in SERVE_ENGINES.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

from glm53.recipe.engine import Engine
from glm53.serve.engines.base import ServeEngine
from glm53.serve.engines.exllamav3 import EXLLAMAV3
from glm53.serve.engines.vllm import VLLM
from glm53.serve.exec import EngineProcess, exec_in_place
from glm53.serve.launch import LaunchSpec

SERVE_ENGINES: dict[Engine, ServeEngine] = {"vllm": VLLM, "exllamav3": EXLLAMAV3}


def engine_of(name: Engine) -> ServeEngine:
    return SERVE_ENGINES[name]


def exec_launch(
    spec: LaunchSpec, *, api_key: str | None = None, inherited: Mapping[str, str] | None = None
) -> NoReturn:
    """Replace this process with the launch's engine (`--exec`). Only returns by raising (the program cannot be
    found)."""
    exec_in_place(prepare_launch(spec, api_key=api_key, inherited=inherited))


def prepare_launch(
    spec: LaunchSpec, *, api_key: str | None = None, inherited: Mapping[str, str] | None = None
) -> EngineProcess:
    """The process the launch's engine runs as, its files written."""
    environ = os.environ if inherited is None else inherited
    return engine_of(spec.engine).prepare(spec, api_key=api_key, inherited=environ)


__all__ = ["SERVE_ENGINES", "ServeEngine", "engine_of", "exec_launch", "prepare_launch"]
