"""NVIDIA GPUs through NVML (nvidia-ml-py's `pynvml`), imported only when asked.

`read_gpus()` returns one GpuInfo per device, or raises NoGpu with the reason in plain words (no driver, no
device, NVML missing). Tests pass a stand-in module that speaks pynvml's API surface.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    driver_version: str
    compute_capability: tuple[int, int]
    uuid: str | None = None
    pci_bus_id: str | None = None  # NVML's form, e.g. 00000000:41:00.0 (see topology.pci_device_numa_node)

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)


class NoGpu(Exception):
    """No NVIDIA GPU can be used here; the message says why."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpus(nvml: ModuleType | Any | None = None) -> list[GpuInfo]:
    if nvml is None:
        try:
            import pynvml as nvml_module  # heavy: NVML is loaded only when GPUs are read
        except ImportError as exc:
            raise NoGpu("nvidia-ml-py (pynvml) is not installed") from exc
        nvml = nvml_module
    error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error_type as exc:
        raise NoGpu(f"NVML cannot start: {exc} (no NVIDIA driver on this machine?)") from exc
    except OSError as exc:  # libnvidia-ml.so missing on some pynvml versions
        raise NoGpu(f"NVML library not found: {exc}") from exc
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            raise NoGpu(f"the NVIDIA driver {driver} sees no GPU")
        gpus: list[GpuInfo] = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
            except (error_type, AttributeError):
                uuid = None
            try:
                bus: str | None = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            except (error_type, AttributeError):
                bus = None
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    driver_version=driver,
                    compute_capability=(int(major), int(minor)),
                    uuid=uuid,
                    pci_bus_id=bus,
                )
            )
        return gpus
    except error_type as exc:
        raise NoGpu(f"NVML query failed: {exc}") from exc
    finally:
        with contextlib.suppress(error_type):
            nvml.nvmlShutdown()
