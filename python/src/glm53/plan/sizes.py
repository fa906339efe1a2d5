"""Memory sizes as people write them ('24GiB', '24G', '24GB', plain bytes), and the GPUs given by theirs."""

from __future__ import annotations

import re
from decimal import Decimal

from glm53.errors import BadInput
from glm53.plan.planner import GpuSpec

_SIZE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
# No memory is larger than this (8 EiB): a bigger figure is a typo, and would overflow the arithmetic after.
MAX_SIZE = (1 << 63) - 1
# More GPUs than one host holds is a typo (and a list that long would fill memory).
MAX_GPUS = 1024
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "KB": 10**3,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "MB": 10**6,
    "G": 1 << 30,
    "GIB": 1 << 30,
    "GB": 10**9,
    "T": 1 << 40,
    "TIB": 1 << 40,
    "TB": 10**12,
}


def parse_size(text: str, *, flag: str, positive: bool = False) -> int:
    """'24GiB', '24G' (binary), '24GB' (decimal) or plain bytes; with `positive`, zero is refused too."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else ""
    if match is None or unit not in _UNITS:
        raise BadInput(f"{flag}: {text[:40]!r} is not a size", hint="write e.g. 24GiB, 24576MiB or 25769803776")
    size = int(Decimal(match.group(1)) * _UNITS[unit])
    if size > MAX_SIZE:
        raise BadInput(f"{flag}: {text!r} is larger than any memory ({MAX_SIZE:,} bytes at most)")
    if positive and size <= 0:
        raise BadInput(f"{flag}: {text!r} is no memory at all", hint="give a size above zero, e.g. 24GiB")
    return size


def gpus_from_sizes(gpu_memory: str | None, gpus: int | None, gpu: str | None) -> list[GpuSpec] | None:
    """The GPUs as given: one size each (--gpu-memory 24GiB,24GiB), or a count of one size (--gpus 2 --gpu
    24GiB); None when neither is given, so that the planner detects them."""
    if gpu_memory is not None:
        if gpus is not None or gpu is not None:
            raise BadInput("give either --gpu-memory or --gpus with --gpu, not both")
        sizes = [parse_size(part, flag="--gpu-memory", positive=True) for part in gpu_memory.split(",") if part.strip()]
        if not sizes:
            raise BadInput("--gpu-memory is empty", hint="e.g. --gpu-memory 24GiB,24GiB")
        if len(sizes) > MAX_GPUS:
            raise BadInput(f"--gpu-memory lists {len(sizes):,} GPUs, more than {MAX_GPUS} on one host")
        return [GpuSpec(index=i, total_bytes=size) for i, size in enumerate(sizes)]
    if gpu is not None or gpus is not None:
        if gpu is None:
            raise BadInput("--gpus needs --gpu SIZE (memory of each GPU)", hint="e.g. --gpus 2 --gpu 24GiB")
        size = parse_size(gpu, flag="--gpu", positive=True)
        if (gpus or 1) > MAX_GPUS:
            raise BadInput(f"--gpus {gpus:,}: more than {MAX_GPUS} GPUs on one host", hint="e.g. --gpus 2 --gpu 24GiB")
        return [GpuSpec(index=i, total_bytes=size) for i in range(gpus or 1)]
    return None


__all__ = ["gpus_from_sizes", "parse_size"]
