"""The GPUs a plan is for: read from NVML on this host, or given by their memory sizes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from glm53.errors import BadInput
from glm53.host.gpus import GpuInfo
from glm53.host.topology import pci_device_numa_node
from glm53.plan.inputs.sizes import parse_size

# RTX 3090 memory bandwidth (GDDR6X, 384-bit at 19.5 Gb/s).
ASSUMED_GPU_MEMORY_BANDWIDTH = 936.2e9
# More GPUs than one host holds is a typo (and a list that long would fill memory).
MAX_GPUS = 1024


class GpuSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    name: str = "GPU"
    total_bytes: int = Field(gt=0)
    used_bytes: int = 0
    memory_bandwidth: float = ASSUMED_GPU_MEMORY_BANDWIDTH
    pci_bus_id: str | None = None
    numa_node: int | None = None  # the PCI device's NUMA node (sysfs); None: unknown or -1


def gpu_spec(gpu: GpuInfo, root: Path | None = None) -> GpuSpec:
    """A GpuSpec from NVML's facts; with `root`, the GPU's NUMA node from sysfs under it."""
    node = pci_device_numa_node(root, gpu.pci_bus_id) if root is not None and gpu.pci_bus_id else None
    return GpuSpec(
        index=gpu.index,
        name=gpu.name,
        total_bytes=gpu.memory_total_bytes,
        used_bytes=gpu.memory_used_bytes,
        pci_bus_id=gpu.pci_bus_id,
        numa_node=node,
    )


def gpus_from_sizes(gpu_memory: str | None, gpus: int | None, gpu: str | None) -> list[GpuSpec] | None:
    """The GPUs as given: one size each (--gpu-memory 24GiB,24GiB), or a count of one size (--gpus 2 --gpu
    24GiB); None when neither is given, so that the planner detects them."""
    if gpu_memory is not None:
        if gpus is not None or gpu is not None:
            raise BadInput("give either --gpu-memory or --gpus with --gpu, not both")
        sizes = [parse_size(part, flag="--gpu-memory", positive=True) for part in gpu_memory.split(",") if part.strip()]
        if not sizes:
            raise BadInput("--gpu-memory is empty", fix="e.g. --gpu-memory 24GiB,24GiB")
        if len(sizes) > MAX_GPUS:
            raise BadInput(f"--gpu-memory lists {len(sizes):,} GPUs, more than {MAX_GPUS} on one host")
        return [GpuSpec(index=i, total_bytes=size) for i, size in enumerate(sizes)]
    if gpu is not None or gpus is not None:
        if gpu is None:
            raise BadInput("--gpus needs --gpu SIZE (memory of each GPU)", fix="e.g. --gpus 2 --gpu 24GiB")
        size = parse_size(gpu, flag="--gpu", positive=True)
        if (gpus or 1) > MAX_GPUS:
            raise BadInput(f"--gpus {gpus:,}: more than {MAX_GPUS} GPUs on one host", fix="e.g. --gpus 2 --gpu 24GiB")
        return [GpuSpec(index=i, total_bytes=size) for i in range(gpus or 1)]
    return None
