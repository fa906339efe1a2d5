"""The ExLlamaV3 + TabbyAPI engine's preflight: GPUS GPUs (its planner checks the RAM its CPU experts need),
TabbyAPI's source tree, ExLlamaV3 at the pinned version with its extension prebuilt, and GPUs of compute
capability 8.0 or newer."""

from __future__ import annotations

from collections.abc import Sequence

from glm53.host.exl3_engine import (
    CACHE_EXTENSION_MODULE,
    EXTENSION_MODULE,
    TABBY_DIR_ENV,
    Exl3EngineFacts,
    read_exl3_engine,
)
from glm53.host.gpus import GpuInfo
from glm53.preflight.models import (
    EXL3_MIN_COMPUTE_CAPABILITY,
    HOST_OVERHEAD_BYTES,
    DoctorFacts,
    DoctorFinding,
    HostLimits,
    Requirements,
)
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile


def check_exl3_engine(facts: Exl3EngineFacts, gpus: Sequence[GpuInfo], pinned_version: str) -> list[DoctorFinding]:
    """TabbyAPI's source tree, ExLlamaV3 at the pinned version with its extension prebuilt, and GPUs of
    compute capability 8.0 or newer."""
    checks: list[DoctorFinding] = []
    if facts.tabby_main:
        checks.append(DoctorFinding(name="tabbyapi", status="ok", detail=f"{facts.tabby_dir} (${TABBY_DIR_ENV})"))
    else:
        where = f"{facts.tabby_dir} has no main.py and common/config_models.py" if facts.tabby_dir else "not set"
        checks.append(
            DoctorFinding(
                name="tabbyapi",
                status="fail",
                detail=f"${TABBY_DIR_ENV}: {where}",
                fix=f"set {TABBY_DIR_ENV} to TabbyAPI's source tree at the pinned commit: DIR/tabbyapi of "
                "`glm53 repro install-engine DIR` (without Nix), nix build .#tabbyapi, or a git checkout of "
                "engine.tabbyapi.rev in repro.lock.json",
            )
        )
    version = facts.exllamav3_version
    if version is None:
        where = f" in {facts.tabby_python}" if facts.tabby_python else ""
        checks.append(
            DoctorFinding(
                name="exllamav3",
                status="fail",
                detail=facts.tabby_python_error or f"not installed{where}",
                fix=f"install ExLlamaV3 {pinned_version} with its extension prebuilt: `glm53 repro install-engine DIR` "
                "(without Nix), then GLM53_TABBYAPI_PYTHON=DIR/venv/bin/python",
            )
        )
    elif version.split("+")[0] != pinned_version:
        checks.append(
            DoctorFinding(
                name="exllamav3",
                status="fail",
                detail=f"{version}, pinned {pinned_version}",
                fix=f"install ExLlamaV3 {pinned_version}: the planner and the CPU offload are validated on it",
            )
        )
    else:
        checks.append(DoctorFinding(name="exllamav3", status="ok", detail=version))
    if facts.extension:
        checks.append(DoctorFinding(name="exllamav3 extension", status="ok", detail=f"prebuilt: {facts.extension}"))
    else:
        checks.append(
            DoctorFinding(
                name="exllamav3 extension",
                status="fail",
                detail=f"no prebuilt {EXTENSION_MODULE}: ExLlamaV3 would compile its CUDA sources at start",
                fix="build it once with pkgs/exllamav3/build_ext.py for this GPU's architecture (Nix and "
                "`glm53 repro install-engine DIR` do)",
            )
        )
    old = [gpu for gpu in gpus if tuple(gpu.compute_capability) < EXL3_MIN_COMPUTE_CAPABILITY]
    if old:
        names = ", ".join(
            f"GPU {gpu.index} {gpu.name} (sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]})" for gpu in old
        )
        checks.append(
            DoctorFinding(
                name="compute capability",
                status="fail",
                detail=f"{names}: ExLlamaV3 needs 8.0 or newer",
                fix="use Ampere or newer GPUs (RTX 30xx and up)",
            )
        )
    elif gpus:
        caps = sorted({f"{g.compute_capability[0]}.{g.compute_capability[1]}" for g in gpus})
        checks.append(DoctorFinding(name="compute capability", status="ok", detail=", ".join(caps)))
    return checks


class Exllamav3Preflight:
    name: Engine = "exllamav3"
    reads_engine_libraries = False  # vLLM's libraries are not this engine's
    runs_in_container = False

    def requirements(self, profile: Profile) -> Requirements:
        return Requirements(
            engine="exllamav3",
            gpus=int(profile.value("GPUS") or "1"),
            ram_bytes=HOST_OVERHEAD_BYTES,
            expert_cache=profile.value("EXPERT_CACHE") == "1",
        )

    def read_engine(self) -> Exl3EngineFacts | None:
        return read_exl3_engine()

    def checks(self, facts: DoctorFacts, need: Requirements, limits: HostLimits) -> list[DoctorFinding]:
        engine = facts.exl3 if facts.exl3 is not None else read_exl3_engine()
        checks = check_exl3_engine(engine, facts.host.gpus, limits.exllamav3_version)
        if need.expert_cache:
            checks.append(check_cache_extension(engine))
        return checks

    def gpu_count_fix(self, found: int, limits: HostLimits) -> str:
        # TENSOR_PARALLEL_SIZE is a vLLM key: an exllamav3 profile refuses it
        return f"use a profile for {found} GPU(s) (e.g. exl3-1gpu), or --set GPUS={found}"


def check_cache_extension(facts: Exl3EngineFacts) -> DoctorFinding:
    """EXPERT_CACHE=1 runs glm53's cache extension in TabbyAPI's process: prebuilt, never compiled at start."""
    if facts.cache_extension:
        return DoctorFinding(name="expert cache extension", status="ok", detail=f"prebuilt: {facts.cache_extension}")
    return DoctorFinding(
        name="expert cache extension",
        status="fail",
        detail=f"EXPERT_CACHE=1, and no {CACHE_EXTENSION_MODULE} module is importable",
        fix="build it once for this GPU: EXL3_EXTENSION_NAME=glm53_expert_cache python3 pkgs/exllamav3/build_ext.py "
        "pkgs/exllamav3/expert-cache SITE_DIR (Nix builds it into the exllamav3 package), or EXPERT_CACHE=0",
    )


EXLLAMAV3_PREFLIGHT = Exllamav3Preflight()
