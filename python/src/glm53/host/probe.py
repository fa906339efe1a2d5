"""Host->device bandwidth at expert-sized blocks, for the planner's cost model (`glm53 probe`).

Three ways an expert reaches the GPU:
    pinned    cudaMemcpyAsync from page-locked host memory (what a GPU expert-cache fill uses)
    pageable  the same copy from ordinary memory (the driver stages it through its own pinned buffers)
    mapped    a kernel reading page-locked host memory in place through unified virtual addressing (UVA),
              as vLLM's UVA offload does for weights it never copies
torch is imported only when a probe runs; without a CUDA device the probe stops with exit code 3.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from glm53.errors import BadInput, Unavailable

PROBE_FORMAT = "glm53-probe"
EXPERT_BLOCK_BYTES = 9_474_060  # one routed expert of the 3.05bpw checkpoint
MAX_BLOCK_BYTES = 4 << 30  # three buffers of this size live at once (pinned, pageable and on the device)
MAX_REPEATS = 100_000

MemoryKind = Literal["pinned", "pageable", "mapped"]


class ProbeResult(BaseModel):
    kind: MemoryKind
    block_bytes: int = Field(gt=0)
    # A rate of 0, a negative one, NaN or Infinity is no measurement (and would be invalid JSON in the plan).
    bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    seconds: float = Field(ge=0, allow_inf_nan=False)
    repeats: int = Field(gt=0)


class ProbeReport(BaseModel):
    """What `glm53 probe --json` writes; the planner reads it back (`glm53 plan --bandwidth`)."""

    format: str = PROBE_FORMAT
    version: int = 1
    device: str
    torch: str
    cuda: str | None = None
    results: list[ProbeResult]


def _torch() -> Any:
    try:
        import torch  # heavy: torch and CUDA load only for a probe
    except (ImportError, OSError) as exc:  # OSError: torch present but a CUDA library it loads is not
        raise Unavailable("glm53 probe needs torch with CUDA", fix="install torch with CUDA support") from exc
    if not torch.cuda.is_available():
        raise Unavailable(
            "no CUDA device is available to probe",
            fix="run `glm53 probe` on the GPU host; pass its JSON to `glm53 plan host --bandwidth`",
        )
    return torch


class _CudaArray:
    """Exposes a device pointer through __cuda_array_interface__ so torch can wrap it without a copy."""

    def __init__(self, pointer: int, length: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": "<i4",
            "data": (pointer, False),
            "version": 2,
            "strides": None,
        }


def _time_ms(torch: Any, action: Any, repeats: int) -> float:
    action()  # warm-up
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        action()
    stop.record()
    stop.synchronize()
    return float(start.elapsed_time(stop))


def check_probe_args(block_bytes: int, repeats: int, device: int) -> None:
    if not 1 <= block_bytes <= MAX_BLOCK_BYTES:
        raise BadInput(f"--block-bytes {block_bytes:,} must lie in 1..{MAX_BLOCK_BYTES:,}", fix="e.g. 9474060")
    if not 1 <= repeats <= MAX_REPEATS:
        raise BadInput(f"--repeats {repeats:,} must lie in 1..{MAX_REPEATS:,}", fix="e.g. 50")
    if device < 0:
        raise BadInput(f"--device {device} is not a device index", fix="0 is the first GPU")


def probe_bandwidth(block_bytes: int = EXPERT_BLOCK_BYTES, repeats: int = 50, device: int = 0) -> ProbeReport:
    check_probe_args(block_bytes, repeats, device)
    torch = _torch()
    count = int(torch.cuda.device_count())
    if device >= count:
        raise BadInput(f"--device {device}: this host has {count} CUDA device(s)", fix=f"use 0..{count - 1}")
    try:
        return _measure(torch, block_bytes, repeats, device)
    except (RuntimeError, AssertionError) as exc:  # CUDA errors: out of memory, a busy or lost device
        raise Unavailable(
            f"the probe failed on CUDA device {device}: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}",
            fix="check the GPU with nvidia-smi; try a smaller --block-bytes",
        ) from exc


def _measure(torch: Any, block_bytes: int, repeats: int, device: int) -> ProbeReport:
    torch.cuda.set_device(device)
    words = -(-block_bytes // 4)
    target = torch.empty(words, dtype=torch.int32, device=f"cuda:{device}")
    pinned = torch.ones(words, dtype=torch.int32).pin_memory()
    pageable = torch.ones(words, dtype=torch.int32)
    results: list[ProbeResult] = []

    def record(kind: MemoryKind, action: Any) -> None:
        milliseconds = _time_ms(torch, action, repeats)
        seconds = milliseconds / 1e3
        results.append(
            ProbeResult(
                kind=kind,
                block_bytes=block_bytes,
                bytes_per_s=block_bytes * repeats / seconds,
                seconds=seconds,
                repeats=repeats,
            )
        )

    record("pinned", lambda: target.copy_(pinned, non_blocking=True))
    record("pageable", lambda: target.copy_(pageable, non_blocking=False))
    # Under UVA a page-locked host allocation has the same address on the device: read it with a kernel.
    mapped = torch.as_tensor(_CudaArray(pinned.data_ptr(), words), device=f"cuda:{device}")
    record("mapped", lambda: torch.add(mapped, 0, out=target))
    properties = torch.cuda.get_device_properties(device)
    return ProbeReport(
        format=PROBE_FORMAT,
        device=f"{device}: {properties.name}",
        torch=str(torch.__version__),
        cuda=str(torch.version.cuda),
        results=results,
    )


def timed_probe(block_bytes: int, repeats: int, device: int) -> tuple[ProbeReport, float]:
    check_probe_args(block_bytes, repeats, device)
    started = time.perf_counter()
    report = probe_bandwidth(block_bytes, repeats, device)
    return report, time.perf_counter() - started


__all__ = [
    "EXPERT_BLOCK_BYTES",
    "PROBE_FORMAT",
    "MemoryKind",
    "ProbeReport",
    "ProbeResult",
    "check_probe_args",
    "probe_bandwidth",
    "timed_probe",
]
