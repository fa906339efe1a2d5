"""Host preflight: facts read once from a root (/proc, /sys, /dev/shm) and NVML; checks are pure functions.

    read_facts(root, ...) -> HostFacts          I/O: files under root, NVML, a test bind of the port
    run_checks(facts, needs) -> DoctorReport    pure: one Check per line, each failure with its fix

`needs` (what the profile asks of the host: GPUs, pinned memory, RAM) comes from `requirements_for(profile)`,
so the `cpu-tiny` profile passes on a machine without a GPU while `agent-256k` says plainly what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from glm53.host.gpus import GpuInfo, NoGpu, read_gpus
from glm53.host.memory import HostMemory, read_host_memory
from glm53.host.native_libs import MissingLibrary, describe_missing, missing_engine_libraries
from glm53.serve.profiles import Profile

Status = Literal["ok", "warn", "fail", "skip"]

GIB = 1 << 30
MIB = 1 << 20
MIN_DRIVER_MAJOR = 580
MIN_KERNEL = (5, 14)
GPU_USED_WARN_BYTES = 1000 * MIB
GPU_MIN_TOTAL_BYTES = 23_000 * MIB
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# Serving overhead on top of the offloaded weights (the planner's reserve), and the tiny model's footprint.
HOST_OVERHEAD_BYTES = 10 * GIB
TINY_RAM_BYTES = 4 * GIB
# Names of shared-memory segments vLLM and torch multiprocessing create (Python's SharedMemory, torch, NCCL).
SHM_SEGMENT = re.compile(r"^(psm_|wnsm_|torch_|nccl|vllm|sem\.mp-)")


class Check(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    status: Status
    detail: str
    fix: str | None = None


class DoctorReport(BaseModel):
    profile: str | None
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]


class Requirements(BaseModel):
    """What a profile needs from the host."""

    model_config = ConfigDict(frozen=True)

    gpus: int = 0
    pinned_memory: bool = False
    ram_bytes: int = TINY_RAM_BYTES


class ShmSegment(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    size_bytes: int
    in_use: bool | None  # None: could not tell (another user's processes)


class HostFacts(BaseModel):
    machine: str
    kernel_release: str | None
    cpu_flags: list[str]
    memory: HostMemory | None
    memory_error: str | None = None
    memlock_soft_bytes: int | None  # None = unlimited
    memlock_known: bool = True
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    shm_segments: list[ShmSegment]
    thp: str | None
    gpus: list[GpuInfo]
    gpu_error: str | None
    host: str
    port: int | None
    port_error: str | None  # None = free
    model_dir: str | None = None
    model_verified: bool | None = None
    model_detail: str | None = None
    index_ok: bool | None = None
    index_detail: str | None = None
    # Shared libraries the engine's extension modules need and the loader cannot find; None: not checked.
    engine_libraries_missing: list[MissingLibrary] | None = None


# ---------------------------------------------------------------- readers (I/O, everything under `root`)


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


def port_error(host: str, port: int) -> str | None:
    """None when `port` can be bound on `host`; otherwise why not (in use, permission)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            return exc.strerror or str(exc)
    return None


def read_model(model_dir: Path) -> tuple[bool, str, bool | None, str | None]:
    """Verify the checkpoint against its lock (stat cache makes repeats cheap) and check its index."""
    from glm53.checkpoint.index_repair import check_index
    from glm53.checkpoint.verify import verify_checkpoint
    from glm53.errors import Glm53Error

    try:
        report = verify_checkpoint(model_dir)
        verified, detail = report.ok, report.summary
    except Glm53Error as exc:
        verified, detail = False, exc.message
    if not (model_dir / "model.safetensors.index.json").is_file():
        return verified, detail, None, "single-file checkpoint: no index"
    try:
        index = check_index(model_dir)
        return verified, detail, index.ok, index.summary
    except Glm53Error as exc:
        return verified, detail, False, exc.message


def read_facts(
    root: Path = Path("/"),
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    model_dir: Path | None = None,
    gpu_reader: Callable[[], list[GpuInfo]] = read_gpus,
    engine_libraries: Callable[[], list[MissingLibrary]] = missing_engine_libraries,
    machine: str | None = None,
) -> HostFacts:
    memory: HostMemory | None = None
    memory_error: str | None = None
    try:
        memory = read_host_memory(root)
    except Exception as exc:  # a fact that cannot be read becomes a failed check, not a crash
        memory_error = getattr(exc, "message", str(exc))
    try:
        gpus, gpu_error = gpu_reader(), None
    except NoGpu as exc:
        gpus, gpu_error = [], str(exc)
    memlock, memlock_known = read_memlock(root)
    shm_total, shm_free, segments = read_shm(root)
    release = _read(root / "proc/sys/kernel/osrelease")
    facts: dict[str, Any] = {
        "machine": machine or os.uname().machine,
        "kernel_release": release.strip() if release else None,
        "cpu_flags": read_cpu_flags(root),
        "memory": memory,
        "memory_error": memory_error,
        "memlock_soft_bytes": memlock,
        "memlock_known": memlock_known,
        "shm_total_bytes": shm_total,
        "shm_free_bytes": shm_free,
        "shm_segments": segments,
        "thp": read_thp(root),
        "gpus": gpus,
        "gpu_error": gpu_error,
        "host": host,
        "port": port,
        "port_error": port_error(host, port) if port is not None else None,
        "engine_libraries_missing": engine_libraries(),
    }
    if model_dir is not None:
        verified, detail, index_ok, index_detail = read_model(model_dir)
        facts |= {
            "model_dir": str(model_dir),
            "model_verified": verified,
            "model_detail": detail,
            "index_ok": index_ok,
            "index_detail": index_detail,
        }
    return HostFacts.model_validate(facts)


# ---------------------------------------------------------------- checks (pure)


def requirements_for(profile: Profile) -> Requirements:
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


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB"


def _size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def check_platform(f: HostFacts) -> Check:
    ok = f.machine in ("x86_64", "amd64")
    return Check(
        name="platform",
        status="ok" if ok else "fail",
        detail=f"Linux {f.machine}",
        fix=None if ok else "the recipe's kernels and vLLM wheels are built for x86_64",
    )


def check_gpus(f: HostFacts, need: Requirements) -> list[Check]:
    if not f.gpus:
        if need.gpus == 0:
            return [
                Check(
                    name="gpus",
                    status="ok",
                    detail=f"no NVIDIA GPU: {f.gpu_error}; this profile runs on the CPU",
                )
            ]
        return [
            Check(
                name="gpus",
                status="fail",
                detail=f"no NVIDIA GPU: {f.gpu_error}; this profile needs {need.gpus}",
                fix="run on the GPU machine (driver >= 580 installed), or use --profile cpu-tiny here",
            )
        ]
    checks: list[Check] = []
    count_ok = len(f.gpus) >= need.gpus
    checks.append(
        Check(
            name="gpu count",
            status="ok" if count_ok else "fail",
            detail=f"{len(f.gpus)} GPU(s): "
            + ", ".join(g.name for g in f.gpus)
            + (f"; the profile needs {need.gpus}" if need.gpus else ""),
            fix=None
            if count_ok
            else f"set TENSOR_PARALLEL_SIZE={len(f.gpus)} only if the model fits; the recipe needs 2x 24 GB",
        )
    )
    driver = f.gpus[0].driver_version
    major = _version_tuple(driver)[:1]
    driver_ok = bool(major) and major[0] >= MIN_DRIVER_MAJOR
    checks.append(
        Check(
            name="nvidia driver",
            status="ok" if driver_ok else ("fail" if need.gpus else "warn"),
            detail=f"{driver} (need >= {MIN_DRIVER_MAJOR} for CUDA 13 userspace)",
            fix=None if driver_ok else f"install NVIDIA driver {MIN_DRIVER_MAJOR} or newer",
        )
    )
    for gpu in f.gpus:
        cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
        cc_ok = gpu.compute_capability >= (8, 0)
        big = gpu.memory_total_bytes >= GPU_MIN_TOTAL_BYTES
        status: Status = "ok"
        problems: list[str] = []
        fix = None
        if not cc_ok or (need.gpus and not big):
            status = "fail" if need.gpus else "warn"
            if not cc_ok:
                problems.append(f"compute capability {cc} < 8.0")
                fix = "the EXL3 kernels need Ampere (sm_80/sm_86) or newer"
            if not big:
                problems.append(f"total below {_mib(GPU_MIN_TOTAL_BYTES)}")
                fix = (fix + "; " if fix else "") + "use 24 GB cards"
        elif gpu.memory_used_bytes > GPU_USED_WARN_BYTES:
            status = "warn"
            problems.append(f"{_mib(gpu.memory_used_bytes)} already in use")
            fix = "close what holds VRAM (a desktop session, another server): see nvidia-smi"
        detail = (
            f"{gpu.name}, sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}, "
            f"{_mib(gpu.memory_total_bytes)} total, {_mib(gpu.memory_free_bytes)} free"
        )
        if problems:
            detail += " — " + "; ".join(problems)
        checks.append(Check(name=f"gpu {gpu.index}", status=status, detail=detail, fix=fix))
    return checks


def check_ram(f: HostFacts, need: Requirements) -> Check:
    if f.memory is None:
        return Check(
            name="host memory",
            status="fail",
            detail=f"cannot read: {f.memory_error}",
            fix="is /proc mounted?",
        )
    m = f.memory
    limit = (
        "no cgroup limit"
        if m.cgroup_limit_bytes is None
        else f"cgroup v{m.cgroup_version} limit {_gib(m.cgroup_limit_bytes)}"
    )
    detail = (
        f"{_gib(m.mem_total_bytes)} RAM, {limit}, usable {_gib(m.effective_limit_bytes)}; "
        f"needs {_gib(need.ram_bytes)}"
    )
    if m.effective_limit_bytes < need.ram_bytes:
        return Check(
            name="host memory",
            status="fail",
            detail=detail,
            fix="raise the container/cgroup memory limit, or lower CPU_OFFLOAD_GB",
        )
    if m.mem_available_bytes is not None and m.mem_available_bytes < need.ram_bytes:
        return Check(
            name="host memory",
            status="warn",
            detail=detail + f"; only {_gib(m.mem_available_bytes)} available now",
            fix="stop other memory users before starting the server (no swap: host OOM kills it)",
        )
    return Check(name="host memory", status="ok", detail=detail)


def check_memlock(f: HostFacts, need: Requirements) -> Check:
    if not f.memlock_known:
        return Check(
            name="memlock",
            status="warn" if need.pinned_memory else "skip",
            detail="cannot read /proc/self/limits",
        )
    if f.memlock_soft_bytes is None:
        return Check(name="memlock", status="ok", detail="unlimited")
    value = f"{f.memlock_soft_bytes / MIB:,.1f} MiB"
    if need.pinned_memory:
        return Check(
            name="memlock",
            status="fail",
            detail=f"{value}; pinned host expert pools need unlimited",
            fix="ulimit -l unlimited (Docker: --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity)",
        )
    return Check(name="memlock", status="ok", detail=f"{value}; this profile pins no host memory")


def check_shm(f: HostFacts) -> list[Check]:
    if f.shm_total_bytes is None:
        return [
            Check(
                name="/dev/shm",
                status="warn",
                detail="not mounted or not readable",
                fix="mount a tmpfs on /dev/shm (Docker: --ipc host)",
            )
        ]
    checks = []
    small = f.shm_total_bytes < 1 * GIB
    checks.append(
        Check(
            name="/dev/shm",
            status="warn" if small else "ok",
            detail=f"{_gib(f.shm_total_bytes)} ({_gib(f.shm_free_bytes or 0)} free)",
            fix="Docker: --ipc host (the default 64 MiB breaks multi-process vLLM)" if small else None,
        )
    )
    stale = [s for s in f.shm_segments if s.in_use is False]
    unknown = [s for s in f.shm_segments if s.in_use is None]
    if stale:
        names = ", ".join(s.name for s in stale[:5]) + (" ..." if len(stale) > 5 else "")
        total = sum(s.size_bytes for s in stale)
        checks.append(
            Check(
                name="stale shm segments",
                status="warn",
                detail=f"{len(stale)} left by a stopped server ({_size(total)}): {names}",
                fix="rm "
                + " ".join(f"/dev/shm/{s.name}" for s in stale[:5])
                + (" ..." if len(stale) > 5 else ""),
            )
        )
    elif unknown:
        checks.append(
            Check(
                name="stale shm segments",
                status="ok",
                detail=f"{len(unknown)} segment(s) of other users' processes; not checked",
            )
        )
    else:
        checks.append(Check(name="stale shm segments", status="ok", detail="none"))
    return checks


def check_thp(f: HostFacts) -> Check:
    if f.thp is None:
        return Check(name="transparent hugepages", status="skip", detail="not reported by this kernel")
    bad = f.thp == "never"
    return Check(
        name="transparent hugepages",
        status="warn" if bad else "ok",
        detail=f.thp,
        fix="echo madvise > /sys/kernel/mm/transparent_hugepage/enabled" if bad else None,
    )


def check_cpu_flags(f: HostFacts) -> Check:
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in f.cpu_flags]
    have = ", ".join(flag.upper() for flag in REQUIRED_CPU_FLAGS if flag in f.cpu_flags)
    extra = " (AVX-512 too)" if "avx512f" in f.cpu_flags else ""
    if missing:
        return Check(
            name="cpu features",
            status="fail",
            detail=f"missing {', '.join(m.upper() for m in missing)}",
            fix="the CPU expert kernels and vLLM's CPU backend need AVX2, FMA and F16C (x86-64-v3)",
        )
    return Check(name="cpu features", status="ok", detail=have + extra)


def check_kernel(f: HostFacts) -> Check:
    if f.kernel_release is None:
        return Check(name="kernel", status="warn", detail="cannot read /proc/sys/kernel/osrelease")
    ok = _version_tuple(f.kernel_release)[:2] >= MIN_KERNEL
    return Check(
        name="kernel",
        status="ok" if ok else "fail",
        detail=f"{f.kernel_release} (need >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]})",
        fix=None if ok else "upgrade the kernel (Debian 12 ships 6.1)",
    )


def check_port(f: HostFacts) -> Check:
    if f.port is None:
        return Check(name="port", status="skip", detail="no port given")
    if f.port_error is None:
        return Check(name="port", status="ok", detail=f"{f.host}:{f.port} is free")
    return Check(
        name="port",
        status="fail",
        detail=f"{f.host}:{f.port} {f.port_error}",
        fix=f"stop what listens there (ss -ltnp 'sport = :{f.port}') or pass --port",
    )


def check_model(f: HostFacts) -> list[Check]:
    if f.model_dir is None:
        return [Check(name="model", status="skip", detail="no model directory given")]
    checks = [
        Check(
            name="model verified",
            status="ok" if f.model_verified else "fail",
            detail=f"{f.model_dir}: {f.model_detail}",
            fix=None
            if f.model_verified
            else f"glm53 model verify {f.model_dir} (lock it first with "
            f"`glm53 model lock` if it has no checkpoint.lock.json)",
        )
    ]
    if f.index_ok is None:
        checks.append(Check(name="model index", status="ok", detail=f.index_detail or "no index"))
    else:
        checks.append(
            Check(
                name="model index",
                status="ok" if f.index_ok else "fail",
                detail=f.index_detail or "",
                fix=None
                if f.index_ok
                else f"glm53 model install {f.model_dir} (adds the tensors "
                "the upstream index leaves out, keeps the original)",
            )
        )
    return checks


ENGINE_LIBRARIES_CHECK = "engine libraries"


def check_engine_libraries(f: HostFacts) -> Check:
    if f.engine_libraries_missing is None:
        return Check(name=ENGINE_LIBRARIES_CHECK, status="skip", detail="not checked")
    if not f.engine_libraries_missing:
        return Check(
            name=ENGINE_LIBRARIES_CHECK, status="ok", detail="every shared library vLLM and torch link is found"
        )
    detail, fix = describe_missing(f.engine_libraries_missing)
    return Check(name=ENGINE_LIBRARIES_CHECK, status="fail", detail=detail, fix=fix)


def run_checks(facts: HostFacts, need: Requirements, *, profile: str | None = None) -> DoctorReport:
    checks: list[Check] = [check_platform(facts), check_engine_libraries(facts)]
    checks += check_gpus(facts, need)
    checks += [check_ram(facts, need), check_memlock(facts, need)]
    checks += check_shm(facts)
    checks += [check_thp(facts), check_cpu_flags(facts), check_kernel(facts), check_port(facts)]
    checks += check_model(facts)
    return DoctorReport(profile=profile, checks=checks)
