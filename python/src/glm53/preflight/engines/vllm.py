"""The vLLM engine's preflight: tensor-parallel GPUs, pinned host pools for UVA offload, RAM for the offload,
and the shared libraries vLLM and torch link."""

from __future__ import annotations

from glm53.constants import GIB
from glm53.host.exl3_engine import Exl3EngineFacts
from glm53.host.facts import HostFacts
from glm53.host.native_libs import describe_missing
from glm53.preflight.models import (
    ENGINE_LIBRARIES_CHECK,
    HOST_OVERHEAD_BYTES,
    DoctorFacts,
    DoctorFinding,
    HostLimits,
    Requirements,
)
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile


def check_engine_libraries(f: HostFacts) -> DoctorFinding:
    if f.engine_libraries_missing is None:
        return DoctorFinding(name=ENGINE_LIBRARIES_CHECK, status="skip", detail="not checked")
    if not f.engine_libraries_missing:
        return DoctorFinding(
            name=ENGINE_LIBRARIES_CHECK, status="ok", detail="every shared library vLLM and torch link is found"
        )
    detail, fix = describe_missing(f.engine_libraries_missing)
    return DoctorFinding(name=ENGINE_LIBRARIES_CHECK, status="fail", detail=detail, fix=fix)


class VllmPreflight:
    name: Engine = "vllm"
    reads_engine_libraries = True
    runs_in_container = True

    def requirements(self, profile: Profile) -> Requirements:
        """GPU profiles: tensor-parallel-size GPUs, pinned host pools for UVA offload, RAM for the offload."""
        uses_gpu = (
            profile.is_set("TENSOR_PARALLEL_SIZE")
            or profile.is_set("GPU_MEMORY_UTILIZATION")
            or profile.is_set("QUANTIZATION")
        )
        if not uses_gpu:
            return Requirements()
        gpus = int(profile.value("TENSOR_PARALLEL_SIZE") or "1")
        offload = int(profile.value("CPU_OFFLOAD_GB") or "0") * GIB
        return Requirements(
            gpus=gpus,
            pinned_memory=profile.value("OFFLOAD_BACKEND") == "uva",
            ram_bytes=offload + HOST_OVERHEAD_BYTES,
        )

    def read_engine(self) -> Exl3EngineFacts | None:
        return None  # vLLM's own files are checked through the libraries it links

    def checks(self, facts: DoctorFacts, need: Requirements, limits: HostLimits) -> list[DoctorFinding]:
        return [check_engine_libraries(facts.host)]

    def gpu_count_fix(self, found: int, limits: HostLimits) -> str:
        return (
            f"set TENSOR_PARALLEL_SIZE={found} only if the model fits; the recipe needs "
            f"{limits.gpu_count}x {limits.gpu_memory_bytes // GIB} GB"
        )


VLLM_PREFLIGHT = VllmPreflight()
