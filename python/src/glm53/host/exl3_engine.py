"""What of the exllamav3 engine is installed: TabbyAPI's source tree, ExLlamaV3's version and whether its
extension is prebuilt (never compiled at serve time). The doctor checks these facts
(`glm53.preflight.doctor.check_exl3_engine`).

    read_exl3_engine(environ) -> Exl3EngineFacts       I/O: package metadata and the file system, no import

The facts are the Python's that will run TabbyAPI: $GLM53_TABBYAPI_PYTHON when it names another interpreter
(the environment `glm53 repro install-engine` makes), asked through a short probe, else this one. Nothing here
imports torch or ExLlamaV3: `importlib.util.find_spec` finds the prebuilt module without loading it (loading
it would initialise CUDA).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from glm53.errors import Glm53Error
from glm53.proc import TimedOut, run, text

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
    # Why $GLM53_TABBYAPI_PYTHON could not be asked (missing, not a Python); None when it answered or is unset
    tabby_python_error: str | None = None


# The same lookups in another interpreter: package metadata and find_spec, nothing imported.
_PROBE = """
import importlib.metadata as metadata, importlib.util as util, json
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def origin(name):
    try:
        spec = util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin else None
print(json.dumps({"exllamav3": version("exllamav3"), "fla": version("flash-linear-attention"),
                  "extension": origin("exllamav3_ext"), "cache": origin("glm53_expert_cache")}))
"""
PROBE_TIMEOUT_S = 60.0


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
    python = env.get(TABBY_PYTHON_ENV)
    found = _installed_in(python, env) if python else _installed_here()
    return Exl3EngineFacts(
        tabby_dir=directory,
        tabby_main=main,
        tabby_python=python,
        exllamav3_version=found.get("exllamav3"),
        extension=found.get("extension"),
        fla_version=found.get("fla"),
        cache_extension=found.get("cache"),
        tabby_python_error=found.get("error"),
    )


def _installed_here() -> dict[str, str | None]:
    spec, cache = _find(EXTENSION_MODULE), _find(CACHE_EXTENSION_MODULE)
    return {
        "exllamav3": _version("exllamav3"),
        "fla": _version("flash-linear-attention"),
        "extension": spec.origin if spec is not None and spec.origin else None,
        "cache": cache.origin if cache is not None and cache.origin else None,
    }


def _installed_in(python: str, env: Mapping[str, str]) -> dict[str, str | None]:
    """What TabbyAPI's own Python has installed; {"error": why} when it cannot be asked."""
    program = python if os.sep in python else shutil.which(python, path=env.get("PATH"))
    if program is None or not os.path.isfile(program):
        return {"error": f"${TABBY_PYTHON_ENV} {python} not found"}
    try:
        done = run([program, "-c", _PROBE], env=dict(env), what=f"asking {program}", timeout=PROBE_TIMEOUT_S)
        answer = json.loads(done.stdout.decode().strip().splitlines()[-1]) if done.returncode == 0 else None
    except (Glm53Error, TimedOut, ValueError, IndexError) as exc:
        return {"error": f"${TABBY_PYTHON_ENV} {program} did not answer: {exc}"}
    if not isinstance(answer, dict):
        return {"error": f"${TABBY_PYTHON_ENV} {program} failed: {text(done.stderr)[-200:]}"}
    return {key: (str(value) if value is not None else None) for key, value in answer.items()}


def _find(module: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


__all__ = ["CACHE_EXTENSION_MODULE", "Exl3EngineFacts", "read_exl3_engine"]
