"""What of the exllamav3 engine is installed: TabbyAPI's source tree, ExLlamaV3's version and whether its
extension is prebuilt (never compiled at serve time). The doctor checks these facts
(`glm53.preflight.doctor.check_exl3_engine`).

    read_exl3_engine(environ) -> Exl3EngineFacts       I/O: package metadata and the file system, no import

Nothing here imports torch or ExLlamaV3: `importlib.util.find_spec` finds the prebuilt module without
loading it (loading it would initialise CUDA).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

TABBY_DIR_ENV = "GLM53_TABBYAPI_DIR"
TABBY_PYTHON_ENV = "GLM53_TABBYAPI_PYTHON"
EXTENSION_MODULE = "exllamav3_ext"
# glm53's GPU expert cache (pkgs/exllamav3/expert-cache), built ahead beside exllamav3_ext
CACHE_EXTENSION_MODULE = "glm53_expert_cache"


class Exl3EngineFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    tabby_dir: str | None
    tabby_main: bool  # main.py and common/config_models.py present
    tabby_python: str | None
    exllamav3_version: str | None
    extension: str | None  # where the prebuilt extension module is, None when only the JIT path is left
    fla_version: str | None
    cache_extension: str | None = None  # where glm53_expert_cache is, None when it is not built


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_exl3_engine(environ: Mapping[str, str] | None = None) -> Exl3EngineFacts:
    env = os.environ if environ is None else environ
    directory = env.get(TABBY_DIR_ENV)
    main = bool(directory) and all(
        (Path(directory or "") / name).is_file() for name in ("main.py", "common/config_models.py")
    )
    spec, cache = _find(EXTENSION_MODULE), _find(CACHE_EXTENSION_MODULE)
    return Exl3EngineFacts(
        tabby_dir=directory,
        tabby_main=main,
        tabby_python=env.get(TABBY_PYTHON_ENV),
        exllamav3_version=_version("exllamav3"),
        extension=spec.origin if spec is not None and spec.origin else None,
        fla_version=_version("flash-linear-attention"),
        cache_extension=cache.origin if cache is not None and cache.origin else None,
    )


def _find(module: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


__all__ = ["CACHE_EXTENSION_MODULE", "Exl3EngineFacts", "read_exl3_engine"]
