"""What the exllamav3 engine needs installed: TabbyAPI's source tree, ExLlamaV3 at the pinned version with its
extension prebuilt (never compiled at serve time), and GPUs of compute capability 8.0 or newer.

    read_exl3_engine(environ) -> Exl3EngineFacts       I/O: package metadata and the file system, no import
    check_exl3_engine(facts, gpus, pinned) -> [Check]  pure

Nothing here imports torch or ExLlamaV3: `importlib.util.find_spec` finds the prebuilt module without
loading it (loading it would initialise CUDA).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from glm53.host.gpus import GpuInfo

TABBY_DIR_ENV = "GLM53_TABBYAPI_DIR"
TABBY_PYTHON_ENV = "GLM53_TABBYAPI_PYTHON"
# ExLlamaV3's kernels need Ampere or newer (TabbyAPI: common/hardware.py, hardware_supports_exllamav3).
MIN_COMPUTE_CAPABILITY = (8, 0)
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


def check_exl3_engine(facts: Exl3EngineFacts, gpus: Sequence[GpuInfo], pinned_version: str) -> list[dict[str, str]]:
    """Each check as {name, status, detail, fix?}; doctor turns them into its Check lines."""
    checks: list[dict[str, str]] = []
    if facts.tabby_main:
        checks.append({"name": "tabbyapi", "status": "ok", "detail": f"{facts.tabby_dir} (${TABBY_DIR_ENV})"})
    else:
        where = f"{facts.tabby_dir} has no main.py and common/config_models.py" if facts.tabby_dir else "not set"
        checks.append(
            {
                "name": "tabbyapi",
                "status": "fail",
                "detail": f"${TABBY_DIR_ENV}: {where}",
                "fix": f"set {TABBY_DIR_ENV} to TabbyAPI's source tree at the pinned commit (nix build .#tabbyapi, "
                "or git checkout of engine.tabbyapi.rev in repro.lock.json)",
            }
        )
    version = facts.exllamav3_version
    if version is None:
        checks.append(
            {
                "name": "exllamav3",
                "status": "fail",
                "detail": "not installed",
                "fix": f"install ExLlamaV3 {pinned_version} (repro.lock.json engine.exllamav3), extension prebuilt",
            }
        )
    elif version.split("+")[0] != pinned_version:
        checks.append(
            {
                "name": "exllamav3",
                "status": "fail",
                "detail": f"{version}, pinned {pinned_version}",
                "fix": f"install ExLlamaV3 {pinned_version}: the planner and the CPU offload are validated on it",
            }
        )
    else:
        checks.append({"name": "exllamav3", "status": "ok", "detail": version})
    if facts.extension:
        checks.append({"name": "exllamav3 extension", "status": "ok", "detail": f"prebuilt: {facts.extension}"})
    else:
        checks.append(
            {
                "name": "exllamav3 extension",
                "status": "fail",
                "detail": f"no prebuilt {EXTENSION_MODULE}: ExLlamaV3 would compile its CUDA sources at start",
                "fix": "build it once with pkgs/exllamav3/build_ext.py for this GPU's architecture (Nix does)",
            }
        )
    old = [gpu for gpu in gpus if tuple(gpu.compute_capability) < MIN_COMPUTE_CAPABILITY]
    if old:
        names = ", ".join(
            f"GPU {gpu.index} {gpu.name} (sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]})" for gpu in old
        )
        checks.append(
            {
                "name": "compute capability",
                "status": "fail",
                "detail": f"{names}: ExLlamaV3 needs 8.0 or newer",
                "fix": "use Ampere or newer GPUs (RTX 30xx and up)",
            }
        )
    elif gpus:
        caps = sorted({f"{g.compute_capability[0]}.{g.compute_capability[1]}" for g in gpus})
        checks.append({"name": "compute capability", "status": "ok", "detail": ", ".join(caps)})
    return checks


__all__ = ["Exl3EngineFacts", "check_exl3_engine", "read_exl3_engine"]
