"""What of the exllamav3 engine is installed: TabbyAPI's source tree, ExLlamaV3's version and whether its
extension is prebuilt (never compiled at serve time). The doctor checks these facts
(`glm53.preflight.doctor.check_exl3_engine`).

    read_exl3_engine(environ) -> Exl3EngineFacts       I/O: package metadata and the file system, no import

Nothing here imports torch or ExLlamaV3: `importlib.util.find_spec` finds the prebuilt module without
loading it (loading it would initialise CUDA).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

TABBY_DIR_ENV = "GLM53_TABBYAPI_DIR"
TABBY_PYTHON_ENV = "GLM53_TABBYAPI_PYTHON"
EXTENSION_MODULE = "exllamav3_ext"


class Exl3EngineFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    tabby_dir: str | None
    tabby_main: bool  # main.py and common/config_models.py present
    tabby_python: str | None
    exllamav3_version: str | None
    extension: str | None  # where the prebuilt extension module is, None when only the JIT path is left
    fla_version: str | None


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
    try:
        spec = importlib.util.find_spec(EXTENSION_MODULE)
    except (ImportError, ValueError):
        spec = None
    return Exl3EngineFacts(
        tabby_dir=directory,
        tabby_main=main,
        tabby_python=env.get(TABBY_PYTHON_ENV),
        exllamav3_version=_version("exllamav3"),
        extension=spec.origin if spec is not None and spec.origin else None,
        fla_version=_version("flash-linear-attention"),
    )


__all__ = ["Exl3EngineFacts", "read_exl3_engine"]
