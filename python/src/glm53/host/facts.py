"""Everything glm53 reads about a machine, read once: procfs, sysfs and cgroups under a `root`, /dev/shm, NVML
and the dynamic loader. Doctor, `repro audit-host`, the planner and `serve` all take a HostFacts.

    read_host_facts(root, ...) -> HostFacts     I/O; a fact that cannot be read becomes `None` plus its error
                                               (the checks turn that into a failed line, not a crash)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.host.gpus import GpuInfo, NoGpu, read_gpus
from glm53.host.memory import HostMemory, read_host_memory
from glm53.host.native_libs import MissingLibrary, missing_engine_libraries
from glm53.host.topology import HostTopology, read_topology

# Names of shared-memory segments vLLM and torch multiprocessing create (Python's SharedMemory, torch, NCCL).
SHM_SEGMENT = re.compile(r"^(psm_|wnsm_|torch_|nccl|vllm|sem\.mp-)")


class ShmSegment(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    size_bytes: int
    in_use: bool | None  # None: could not tell (another user's processes)


class HostFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    machine: str
    kernel_release: str | None = None
    cpu_flags: list[str] = []
    memory: HostMemory | None
    memory_error: str | None = None
    topology: HostTopology | None = None
    topology_error: str | None = None
    memlock_soft_bytes: int | None = None  # None = unlimited
    memlock_known: bool = True
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    shm_segments: list[ShmSegment] = []
    thp: str | None = None
    gpus: list[GpuInfo] = []
    gpu_error: str | None = None
    # Shared libraries the engine's extension modules need and the loader cannot find; None: not checked.
    engine_libraries_missing: list[MissingLibrary] | None = None

    def require_memory(self) -> HostMemory:
        if self.memory is None:
            raise BadInput(f"host memory: {self.memory_error}", fix="is /proc mounted?")
        return self.memory

    def require_topology(self) -> HostTopology:
        if self.topology is None:
            raise BadInput(f"CPU topology: {self.topology_error}", fix="is /sys mounted?")
        return self.topology


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_cpu_flags(root: Path) -> list[str]:
    text = _read(root / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return sorted(set(value.split()))
    return []


def read_memlock(root: Path) -> tuple[int | None, bool]:
    """Soft RLIMIT_MEMLOCK from /proc/self/limits: (bytes or None for unlimited, whether it could be read)."""
    text = _read(root / "proc/self/limits")
    if text is None:
        return None, False
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory") :].split()
            if fields:
                return (None if fields[0] == "unlimited" else int(fields[0])), True
    return None, False


def read_thp(root: Path) -> str | None:
    text = _read(root / "sys/kernel/mm/transparent_hugepage/enabled")
    if text is None:
        return None
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else text.strip()


def _shm_users(root: Path, shm: Path) -> tuple[set[str], bool]:
    """Names under /dev/shm that some process maps or holds open; and whether every process could be read."""
    used: set[str] = set()
    complete = True
    proc = root / "proc"
    prefix = "/dev/shm/"
    try:
        pids = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return used, False
    for pid in pids:
        try:
            maps = (pid / "maps").read_text(errors="replace")
        except FileNotFoundError:  # the process has exited
            maps = ""
        except OSError:  # another user's process
            complete = False
            maps = ""
        for line in maps.splitlines():
            where = line.find(prefix)
            if where >= 0:
                used.add(line[where + len(prefix) :].split()[0])
        try:
            fds = list((pid / "fd").iterdir())
        except FileNotFoundError:
            continue
        except OSError:
            complete = False
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix) :].removesuffix(" (deleted)"))
    return used, complete


def read_shm(root: Path) -> tuple[int | None, int | None, list[ShmSegment]]:
    shm = root / "dev/shm"
    try:
        stats = os.statvfs(shm)
        total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        names = sorted(p.name for p in shm.iterdir() if SHM_SEGMENT.match(p.name))
    except OSError:
        return None, None, []
    used, complete = _shm_users(root, shm)
    segments = []
    for name in names:
        try:
            size = (shm / name).stat().st_size
        except OSError:
            continue
        in_use: bool | None = True if name in used else (False if complete else None)
        segments.append(ShmSegment(name=name, size_bytes=size, in_use=in_use))
    return total, free, segments


def _error(exc: Exception) -> str:
    return str(getattr(exc, "message", exc))


def read_host_facts(
    root: Path = Path("/"),
    *,
    gpu_reader: Callable[[], list[GpuInfo]] = read_gpus,
    engine_libraries: Callable[[], list[MissingLibrary]] | None = missing_engine_libraries,
    machine: str | None = None,
) -> HostFacts:
    """Read every fact under `root` (GPUs from NVML; the engine's libraries from this Python unless None)."""
    facts: dict[str, Any] = {"machine": machine or os.uname().machine}
    try:
        facts["memory"] = read_host_memory(root)
    except Exception as exc:  # a fact that cannot be read becomes a failed check, not a crash
        facts |= {"memory": None, "memory_error": _error(exc)}
    try:
        facts["topology"] = read_topology(root)
    except Exception as exc:
        facts["topology_error"] = _error(exc)
    try:
        facts["gpus"] = gpu_reader()
    except NoGpu as exc:
        facts["gpu_error"] = str(exc)
    facts["memlock_soft_bytes"], facts["memlock_known"] = read_memlock(root)
    facts["shm_total_bytes"], facts["shm_free_bytes"], facts["shm_segments"] = read_shm(root)
    release = _read(root / "proc/sys/kernel/osrelease")
    facts |= {
        "kernel_release": release.strip() if release else None,
        "cpu_flags": read_cpu_flags(root),
        "thp": read_thp(root),
        "engine_libraries_missing": engine_libraries() if engine_libraries is not None else None,
    }
    return HostFacts.model_validate(facts)


__all__ = [
    "HostFacts",
    "ShmSegment",
    "read_cpu_flags",
    "read_host_facts",
    "read_memlock",
    "read_shm",
    "read_thp",
]
