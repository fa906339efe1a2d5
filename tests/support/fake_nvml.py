"""A stand-in for nvidia-ml-py's `pynvml` module (no GPU here): the calls glm53.host.gpus makes, same names,
same return shapes (bytes or str names, a memory struct with total/used/free, a (major, minor) tuple)."""

from __future__ import annotations

from dataclasses import dataclass, field


class NVMLError(Exception):
    pass


@dataclass
class _Memory:
    total: int
    used: int

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass
class _PciInfo:
    busId: bytes  # pynvml's field name


@dataclass
class FakeGpu:
    name: str
    total_mib: int
    used_mib: int
    capability: tuple[int, int] = (8, 6)
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str | None = None  # None: nvmlDeviceGetPciInfo fails, as it can on some drivers


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    driver: str = "580.95.05"
    init_error: str | None = None
    calls: list[str] = field(default_factory=list)
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver.encode()  # older pynvml returns bytes

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index >= len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _Memory:
        return _Memory(total=handle.total_mib << 20, used=handle.used_mib << 20)

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        return handle.capability

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> _PciInfo:
        if handle.pci_bus_id is None:
            raise NVMLError("Not Supported")
        return _PciInfo(busId=handle.pci_bus_id.encode())  # older pynvml returns bytes


def two_3090s(*, used_mib: int = 300, driver: str = "580.95.05") -> FakeNvml:
    """What NVML reports for the recipe's machine: 2x RTX 3090 (24,576 MiB, sm_86)."""
    return FakeNvml(
        gpus=[
            FakeGpu("NVIDIA GeForce RTX 3090", 24576, used_mib),
            FakeGpu("NVIDIA GeForce RTX 3090", 24576, 260),
        ],
        driver=driver,
    )
