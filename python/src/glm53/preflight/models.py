"""What preflight reads and reports: the findings and their report, what a profile needs of the host, the
limits of the checks (from repro.lock.json) and the facts the checks run on. Models only: every engine's
preflight (`glm53.preflight.engines`) and the doctor's checks share them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from glm53.constants import GIB, MIB
from glm53.host.exl3_engine import Exl3EngineFacts
from glm53.host.facts import HostFacts
from glm53.recipe.engine import Engine

Status = Literal["ok", "warn", "fail", "skip"]

MIN_KERNEL = (5, 14)
GPU_USED_WARN_BYTES = 1000 * MIB
# NVML reports a card's memory a little under its marketed size: 97% of the validated figure is the same card.
GPU_MEMORY_TOLERANCE = 0.97
SYSTEM_MEMORY_TOLERANCE = 0.95
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# Serving overhead on top of the offloaded weights (the planner's reserve), and the tiny model's footprint.
HOST_OVERHEAD_BYTES = 10 * GIB
TINY_RAM_BYTES = 4 * GIB
ENGINE_LIBRARIES_CHECK = "engine libraries"
# ExLlamaV3's kernels need Ampere or newer (TabbyAPI: common/hardware.py, hardware_supports_exllamav3).
EXL3_MIN_COMPUTE_CAPABILITY = (8, 0)


class DoctorFinding(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    status: Status
    detail: str
    fix: str | None = None


class DoctorReport(BaseModel):
    profile: str | None
    checks: list[DoctorFinding]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def failures(self) -> list[DoctorFinding]:
        return [c for c in self.checks if c.status == "fail"]


class Requirements(BaseModel):
    """What a profile needs from the host."""

    model_config = ConfigDict(frozen=True)

    gpus: int = 0
    pinned_memory: bool = False
    ram_bytes: int = TINY_RAM_BYTES
    engine: Engine = "vllm"
    expert_cache: bool = False  # EXPERT_CACHE=1: glm53's GPU expert cache extension must be built


class HostLimits(BaseModel):
    """The thresholds of the checks, from repro.lock.json (the engine's engine.cuda entry, and hardware)."""

    model_config = ConfigDict(frozen=True)

    engine: Engine = "vllm"
    driver_min: int
    cuda_version: str
    capabilities: list[tuple[int, int]]  # what the engine's kernels are built for
    # The capability whose PTX the kernels carry ("8.6+PTX"): the driver compiles it for any newer GPU.
    ptx: tuple[int, int] | None = None
    gpu: str
    gpu_count: int
    gpu_memory_bytes: int
    system_memory_bytes: int
    exllamav3_version: str = "1.4.6"

    @property
    def gpu_memory_min_bytes(self) -> int:
        return int(self.gpu_memory_bytes * GPU_MEMORY_TOLERANCE)

    def runs_on(self, capability: tuple[int, int]) -> bool:
        """Kernels built for X.y run on X.z with z >= y (CUDA's binary compatibility); their PTX on any newer GPU."""
        if self.ptx is not None and capability >= self.ptx:
            return True
        return any(capability[0] == major and capability[1] >= minor for major, minor in self.capabilities)

    @property
    def capabilities_text(self) -> str:
        text = ", ".join(f"sm_{major}{minor}" for major, minor in self.capabilities)
        return text + (f" (and the PTX of sm_{self.ptx[0]}{self.ptx[1]})" if self.ptx is not None else "")


class TargetFacts(BaseModel):
    """What a start would use besides the host: the address and the checkpoint."""

    address: str
    port: int | None
    port_error: str | None  # None = free
    model_dir: str | None = None
    model_missing: str | None = None  # why the directory cannot be read ("does not exist"); None = it can
    model_verified: bool | None = None
    model_detail: str | None = None
    index_ok: bool | None = None
    index_detail: str | None = None


class ContainerFacts(BaseModel):
    """What running the vendor image needs from the host: a container runtime and the GPUs as CDI devices."""

    model_config = ConfigDict(frozen=True)

    runtimes: list[str]
    cdi_specs: list[str]  # files that declare the nvidia.com/gpu devices


class GpuPathFacts(BaseModel):
    """What the README's GPU paths use besides the driver: Nix (the flake's outputs) and, for the engine that runs
    as an image, a container runtime with the GPUs as CDI devices."""

    model_config = ConfigDict(frozen=True)

    nix: str | None  # where `nix` is on PATH
    containers: ContainerFacts


class DoctorFacts(BaseModel):
    host: HostFacts
    target: TargetFacts
    # The exllamav3 engine's installation (read only for its profiles).
    exl3: Exl3EngineFacts | None = None
    gpu_path: GpuPathFacts | None = None


class DoctorResult(DoctorReport):
    """`glm53 doctor`'s result: the checks and the facts they were made on."""

    facts: DoctorFacts
