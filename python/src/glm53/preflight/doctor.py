"""Host preflight and the host audit: one check engine over facts read once, thresholds from repro.lock.json.

    read_facts(root, ...) -> DoctorFacts           I/O: the host (glm53.host.facts), the port, the checkpoint
    run_checks(facts, needs, limits) -> Report     pure: one Check per line, each failure with its fix
    audit_host(host, limits) -> Report             pure: this host against the validated hardware

`needs` (what the profile asks of the host: GPUs, pinned memory, RAM) comes from `requirements_for(profile)`,
so the `cpu-tiny` profile passes on a machine without a GPU while `agent-256k` says plainly what is missing.
`limits` (driver floor, the engine's compute capabilities, the validated GPU and memory) come from
repro.lock.json through `limits_from_lock`, the same pins `glm53 repro` audits.
"""

from __future__ import annotations

import errno
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from glm53.checkpoint.index_repair import check_index
from glm53.checkpoint.verify import verify_checkpoint
from glm53.constants import DEFAULT_HOST, GIB, MIB
from glm53.errors import Glm53Error
from glm53.fsutil import GET_THE_CHECKPOINT, missing_directory
from glm53.host.facts import HostFacts, read_host_facts
from glm53.host.gpus import GpuInfo, read_gpus
from glm53.host.native_libs import MissingLibrary, missing_engine_libraries
from glm53.preflight.engines import preflight_engine
from glm53.preflight.models import (
    ENGINE_LIBRARIES_CHECK,
    GPU_USED_WARN_BYTES,
    MIN_KERNEL,
    REQUIRED_CPU_FLAGS,
    SYSTEM_MEMORY_TOLERANCE,
    ContainerFacts,
    DoctorFacts,
    DoctorFinding,
    DoctorReport,
    DoctorResult,
    GpuPathFacts,
    HostLimits,
    Requirements,
    Status,
    TargetFacts,
)
from glm53.recipe.engine import Engine
from glm53.recipe.pins import ReproLock, load_repro_lock
from glm53.recipe.profiles import Profile


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.removesuffix("+PTX").partition(".")
    return int(major), int(minor or 0)


def limits_from_lock(lock: ReproLock, engine: Engine = "vllm") -> HostLimits:
    """The limits of `engine` ("vllm" or "exllamav3"): each engine has its own CUDA, driver floor and kernels."""
    cuda = lock.engine.cuda.of(engine)
    ptx = [_capability(c) for c in cuda.capabilities if c.endswith("+PTX")]
    hw = lock.hardware
    return HostLimits(
        engine=engine,
        driver_min=int(cuda.driver_min),
        cuda_version=cuda.version,
        capabilities=[_capability(c) for c in cuda.capabilities],
        ptx=max(ptx) if ptx else None,
        gpu=hw.gpu,
        gpu_count=hw.gpu_count,
        gpu_memory_bytes=hw.gpu_memory_mib * MIB,
        system_memory_bytes=hw.system_memory_gib * GIB,
        exllamav3_version=lock.engine.exllamav3.version,
    )


def load_limits(engine: Engine = "vllm") -> HostLimits:
    return limits_from_lock(load_repro_lock(), engine)


# ---------------------------------------------------------------- readers (I/O)


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
    host: str = DEFAULT_HOST,
    port: int | None = None,
    model_dir: Path | None = None,
    gpu_reader: Callable[[], list[GpuInfo]] = read_gpus,
    engine_libraries: Callable[[], list[MissingLibrary]] = missing_engine_libraries,
    machine: str | None = None,
    engine: Engine = "vllm",
) -> DoctorFacts:
    target = TargetFacts(address=host, port=port, port_error=port_error(host, port) if port is not None else None)
    if model_dir is not None and (missing := missing_directory(model_dir)) is not None:
        target = target.model_copy(update={"model_dir": str(model_dir), "model_missing": missing})
    elif model_dir is not None:
        verified, detail, index_ok, index_detail = read_model(model_dir)
        target = target.model_copy(
            update={
                "model_dir": str(model_dir),
                "model_verified": verified,
                "model_detail": detail,
                "index_ok": index_ok,
                "index_detail": index_detail,
            }
        )
    pre = preflight_engine(engine)
    libraries = engine_libraries if pre.reads_engine_libraries else None
    facts = read_host_facts(root, gpu_reader=gpu_reader, engine_libraries=libraries, machine=machine)
    gpu_path = GpuPathFacts(nix=shutil.which("nix"), containers=read_container_facts(root))
    return DoctorFacts(host=facts, target=target, exl3=pre.read_engine(), gpu_path=gpu_path)


# ---------------------------------------------------------------- checks (pure)


def requirements_for(profile: Profile) -> Requirements:
    """What the profile asks of the host (GPUs, pinned memory, RAM), as its engine's preflight reads it."""
    return preflight_engine(profile.engine).requirements(profile)


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


def check_platform(f: HostFacts) -> DoctorFinding:
    ok = f.machine in ("x86_64", "amd64")
    return DoctorFinding(
        name="platform",
        status="ok" if ok else "fail",
        detail=f"Linux {f.machine}",
        fix=None if ok else "the recipe's kernels and vLLM wheels are built for x86_64",
    )


def _gpu_count_fix(found: int, need: Requirements, limits: HostLimits) -> str:
    return preflight_engine(need.engine).gpu_count_fix(found, limits)


def check_gpus(f: HostFacts, need: Requirements, limits: HostLimits) -> list[DoctorFinding]:
    if not f.gpus:
        if need.gpus == 0:
            return [
                DoctorFinding(
                    name="gpus", status="ok", detail=f"no NVIDIA GPU: {f.gpu_error}; this profile runs on the CPU"
                )
            ]
        return [
            DoctorFinding(
                name="gpus",
                status="fail",
                detail=f"no NVIDIA GPU: {f.gpu_error}; this profile needs {need.gpus}",
                fix=f"run on the GPU machine (driver >= {limits.driver_min} installed), or use --profile cpu-tiny here",
            )
        ]
    checks: list[DoctorFinding] = []
    count_ok = len(f.gpus) >= need.gpus
    checks.append(
        DoctorFinding(
            name="gpu count",
            status="ok" if count_ok else "fail",
            detail=f"{len(f.gpus)} GPU(s): "
            + ", ".join(g.name for g in f.gpus)
            + (f"; the profile needs {need.gpus}" if need.gpus else ""),
            fix=None if count_ok else _gpu_count_fix(len(f.gpus), need, limits),
        )
    )
    drivers = sorted({gpu.driver_version for gpu in f.gpus})
    driver_ok = all(_version_tuple(d)[:1] >= (limits.driver_min,) for d in drivers)
    checks.append(
        DoctorFinding(
            name="nvidia driver",
            status="ok" if driver_ok else ("fail" if need.gpus else "warn"),
            detail=f"{', '.join(drivers)} (need >= {limits.driver_min} for CUDA {limits.cuda_version} userspace)",
            fix=None if driver_ok else f"install NVIDIA driver {limits.driver_min} or newer",
        )
    )
    for gpu in f.gpus:
        cc = f"sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
        cc_ok = limits.runs_on(gpu.compute_capability)
        big = gpu.memory_total_bytes >= limits.gpu_memory_min_bytes
        status: Status = "ok"
        problems: list[str] = []
        fixes: list[str] = []
        if not cc_ok or (need.gpus and not big):
            status = "fail" if need.gpus else "warn"
            if not cc_ok:
                problems.append(f"the engine's kernels are built for {limits.capabilities_text}, not {cc}")
                where = f"engine.cuda.{limits.engine}.capabilities in repro.lock.json"
                fixes.append(f"rebuild the engine for {cc} ({where})")
            if not big:
                problems.append(f"total below {_mib(limits.gpu_memory_min_bytes)}")
                fixes.append(f"use {limits.gpu_memory_bytes // GIB} GB cards")
        elif gpu.memory_used_bytes > GPU_USED_WARN_BYTES:
            status = "warn"
            problems.append(f"{_mib(gpu.memory_used_bytes)} already in use")
            fixes.append("close what holds VRAM (a desktop session, another server): see nvidia-smi")
        detail = f"{gpu.name}, {cc}, {_mib(gpu.memory_total_bytes)} total, {_mib(gpu.memory_free_bytes)} free"
        if problems:
            detail += " — " + "; ".join(problems)
        checks.append(
            DoctorFinding(name=f"gpu {gpu.index}", status=status, detail=detail, fix="; ".join(fixes) or None)
        )
    return checks


def check_ram(f: HostFacts, need: Requirements) -> DoctorFinding:
    if f.memory is None:
        return DoctorFinding(
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
        f"{_gib(m.mem_total_bytes)} RAM, {limit}, usable {_gib(m.effective_limit_bytes)}; needs {_gib(need.ram_bytes)}"
    )
    if m.effective_limit_bytes < need.ram_bytes:
        return DoctorFinding(
            name="host memory",
            status="fail",
            detail=detail,
            fix="raise the container/cgroup memory limit, or lower CPU_OFFLOAD_GB",
        )
    if m.mem_available_bytes is not None and m.mem_available_bytes < need.ram_bytes:
        return DoctorFinding(
            name="host memory",
            status="warn",
            detail=detail + f"; only {_gib(m.mem_available_bytes)} available now",
            fix="stop other memory users before starting the server (no swap: host OOM kills it)",
        )
    return DoctorFinding(name="host memory", status="ok", detail=detail)


def check_memlock(f: HostFacts, need: Requirements) -> DoctorFinding:
    if not f.memlock_known:
        return DoctorFinding(
            name="memlock",
            status="warn" if need.pinned_memory else "skip",
            detail="cannot read /proc/self/limits",
        )
    if f.memlock_soft_bytes is None:
        return DoctorFinding(name="memlock", status="ok", detail="unlimited")
    value = f"{f.memlock_soft_bytes / MIB:,.1f} MiB"
    if need.pinned_memory:
        return DoctorFinding(
            name="memlock",
            status="fail",
            detail=f"{value}; pinned host expert pools need unlimited",
            fix="ulimit -l unlimited (Docker: --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity)",
        )
    return DoctorFinding(name="memlock", status="ok", detail=f"{value}; this profile pins no host memory")


def check_shm(f: HostFacts) -> list[DoctorFinding]:
    if f.shm_total_bytes is None:
        return [
            DoctorFinding(
                name="/dev/shm",
                status="warn",
                detail="not mounted or not readable",
                fix="mount a tmpfs on /dev/shm (Docker: --ipc host)",
            )
        ]
    checks = []
    small = f.shm_total_bytes < 1 * GIB
    checks.append(
        DoctorFinding(
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
            DoctorFinding(
                name="stale shm segments",
                status="warn",
                detail=f"{len(stale)} left by a stopped server ({_size(total)}): {names}",
                fix="rm " + " ".join(f"/dev/shm/{s.name}" for s in stale[:5]) + (" ..." if len(stale) > 5 else ""),
            )
        )
    elif unknown:
        checks.append(
            DoctorFinding(
                name="stale shm segments",
                status="ok",
                detail=f"{len(unknown)} segment(s) of other users' processes; not checked",
            )
        )
    else:
        checks.append(DoctorFinding(name="stale shm segments", status="ok", detail="none"))
    return checks


def check_thp(f: HostFacts) -> DoctorFinding:
    if f.thp is None:
        return DoctorFinding(name="transparent hugepages", status="skip", detail="not reported by this kernel")
    bad = f.thp == "never"
    return DoctorFinding(
        name="transparent hugepages",
        status="warn" if bad else "ok",
        detail=f.thp,
        fix="echo madvise > /sys/kernel/mm/transparent_hugepage/enabled" if bad else None,
    )


def check_cpu_flags(f: HostFacts) -> DoctorFinding:
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in f.cpu_flags]
    have = ", ".join(flag.upper() for flag in REQUIRED_CPU_FLAGS if flag in f.cpu_flags)
    extra = " (AVX-512 too)" if "avx512f" in f.cpu_flags else ""
    if missing:
        return DoctorFinding(
            name="cpu features",
            status="fail",
            detail=f"missing {', '.join(m.upper() for m in missing)}",
            fix="the CPU expert kernels and vLLM's CPU backend need AVX2, FMA and F16C (x86-64-v3)",
        )
    return DoctorFinding(name="cpu features", status="ok", detail=have + extra)


def check_kernel(f: HostFacts) -> DoctorFinding:
    if f.kernel_release is None:
        return DoctorFinding(name="kernel", status="warn", detail="cannot read /proc/sys/kernel/osrelease")
    ok = _version_tuple(f.kernel_release)[:2] >= MIN_KERNEL
    return DoctorFinding(
        name="kernel",
        status="ok" if ok else "fail",
        detail=f"{f.kernel_release} (need >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]})",
        fix=None if ok else "upgrade the kernel (Debian 12 ships 6.1)",
    )


def check_port(f: TargetFacts) -> DoctorFinding:
    if f.port is None:
        return DoctorFinding(name="port", status="skip", detail="no port given")
    if f.port_error is None:
        return DoctorFinding(name="port", status="ok", detail=f"{f.address}:{f.port} is free")
    return DoctorFinding(
        name="port",
        status="fail",
        detail=f"{f.address}:{f.port} {f.port_error}",
        fix=f"stop what listens there (ss -ltnp 'sport = :{f.port}') or pass --port",
    )


def check_model(f: TargetFacts) -> list[DoctorFinding]:
    if f.model_dir is None:
        return [DoctorFinding(name="model", status="skip", detail="no model directory given")]
    if f.model_missing is not None:
        # Nothing in it to verify or index: one failure that says so, not a verdict on a checkpoint.
        return [
            DoctorFinding(
                name="model directory",
                status="fail",
                detail=f"--model-dir {f.model_dir} {f.model_missing}",
                fix=GET_THE_CHECKPOINT,
            )
        ]
    checks = [
        DoctorFinding(
            name="model verified",
            status="ok" if f.model_verified else "fail",
            detail=f"{f.model_dir}: {f.model_detail}",
            fix=None
            if f.model_verified
            else f"glm53 model verify --model-dir {f.model_dir} (lock it first with "
            f"`glm53 model lock` if it has no checkpoint.lock.json)",
        )
    ]
    if f.index_ok is None:
        checks.append(DoctorFinding(name="model index", status="ok", detail=f.index_detail or "no index"))
    else:
        checks.append(
            DoctorFinding(
                name="model index",
                status="ok" if f.index_ok else "fail",
                detail=f.index_detail or "",
                fix=None
                if f.index_ok
                else f"glm53 model install --model-dir {f.model_dir} (adds the tensors "
                "the upstream index leaves out, keeps the original)",
            )
        )
    return checks


def run_checks(
    facts: DoctorFacts, need: Requirements, limits: HostLimits, *, profile: str | None = None
) -> DoctorReport:
    host = facts.host
    checks: list[DoctorFinding] = [check_platform(host)]
    if limits.engine != need.engine:
        raise ValueError(f"the limits are the {limits.engine} engine's; the profile runs {need.engine}")
    checks += preflight_engine(need.engine).checks(facts, need, limits)
    if need.gpus and facts.gpu_path is not None:
        checks += check_gpu_path(facts.gpu_path, image=preflight_engine(need.engine).runs_in_container)
    checks += check_gpus(host, need, limits)
    checks += [check_ram(host, need), check_memlock(host, need)]
    checks += check_shm(host)
    checks += [check_thp(host), check_cpu_flags(host), check_kernel(host), check_port(facts.target)]
    checks += check_model(facts.target)
    return DoctorReport(profile=profile, checks=checks)


# Where the NVIDIA container toolkit writes its CDI specification (nvidia-ctk cdi generate; NixOS's
# hardware.nvidia-container-toolkit writes /var/run/cdi/nvidia-container-toolkit.json).
CDI_DIRS = ("etc/cdi", "var/run/cdi", "run/cdi")
CONTAINER_RUNTIMES = ("podman", "docker")


def read_container_facts(root: Path = Path("/"), which: Callable[[str], str | None] | None = None) -> ContainerFacts:
    find = which or shutil.which
    specs = []
    for folder in CDI_DIRS:
        directory = root / folder
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            try:
                text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
            except OSError:
                continue
            if "nvidia.com/gpu" in text:
                specs.append(f"/{folder}/{path.name}")
    return ContainerFacts(runtimes=[name for name in CONTAINER_RUNTIMES if find(name)], cdi_specs=specs)


def check_containers(facts: ContainerFacts) -> list[DoctorFinding]:
    """The vLLM engine runs in the vendor image: a runtime to run it, and the GPUs handed over through CDI."""
    runtime = DoctorFinding(
        name="container runtime",
        status="ok" if facts.runtimes else "fail",
        detail=", ".join(facts.runtimes) if facts.runtimes else "neither podman nor docker is on PATH",
        fix=None if facts.runtimes else "install podman or docker (NixOS: services.glm53 does it for the vllm engine)",
    )
    cdi = DoctorFinding(
        name="nvidia cdi",
        status="ok" if facts.cdi_specs else "fail",
        detail=", ".join(facts.cdi_specs) if facts.cdi_specs else "no CDI specification names nvidia.com/gpu",
        fix=None
        if facts.cdi_specs
        else "install the NVIDIA container toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` "
        "(NixOS: hardware.nvidia-container-toolkit.enable = true)",
    )
    return [runtime, cdi]


def check_gpu_path(facts: GpuPathFacts, *, image: bool) -> list[DoctorFinding]:
    """The README's GPU prerequisites beyond the driver, as warnings: each path needs only some of them (Nix for
    the flake's outputs; a runtime and CDI for the vLLM engine's image, not for a serve from a Python
    environment)."""
    nix = DoctorFinding(
        name="nix",
        status="ok" if facts.nix else "warn",
        detail=facts.nix or "not on PATH: `nix run`, `nix build .#image` and the NixOS module need it",
        fix=None
        if facts.nix
        else "install Nix (flakes on: experimental-features = nix-command flakes), or serve without it from an "
        'environment with the pinned engine (README, "The real hardware path")',
    )
    if not image:
        return [nix]
    found = check_containers(facts.containers)
    return [nix, *(f.model_copy(update={"status": "warn"}) if f.status == "fail" else f for f in found)]


def audit_host(host: HostFacts, limits: HostLimits, containers: ContainerFacts | None = None) -> DoctorReport:
    """This host against the validated hardware and the engine it will run: the same GPU checks with the
    validated count and the engine's driver floor and kernels, the GPU model and the system memory the
    published figures were measured with; for the vLLM engine (the vendor image), a container runtime and the
    GPUs as CDI devices."""
    need = Requirements(
        engine=limits.engine,
        gpus=limits.gpu_count,
        ram_bytes=int(limits.system_memory_bytes * SYSTEM_MEMORY_TOLERANCE),
    )
    checks = [
        DoctorFinding(
            name="engine",
            status="ok",
            detail=f"{limits.engine}: CUDA {limits.cuda_version}, driver >= {limits.driver_min}, "
            f"kernels for {limits.capabilities_text}",
        )
    ]
    checks += check_gpus(host, need, limits)
    if host.gpus:
        names = [gpu.name for gpu in host.gpus]
        same = all(limits.gpu.removeprefix("NVIDIA ") in name for name in names)
        checks.append(
            DoctorFinding(
                name="gpu model",
                status="ok" if same else "fail",
                detail=f"{', '.join(sorted(set(names)))}; validated {limits.gpu}",
                fix=None if same else f"the published figures were measured on {limits.gpu}: expect others",
            )
        )
    if host.memory is None:
        checks.append(DoctorFinding(name="system memory", status="fail", detail=f"cannot read: {host.memory_error}"))
    else:
        total = host.memory.mem_total_bytes
        enough = total >= need.ram_bytes
        checks.append(
            DoctorFinding(
                name="system memory",
                status="ok" if enough else "fail",
                detail=f"{_gib(total)}, validated {_gib(limits.system_memory_bytes)}",
                fix=None if enough else "fewer experts fit in host RAM: re-plan (glm53 plan host)",
            )
        )
    if containers is not None:
        checks += check_containers(containers)
    return DoctorReport(profile=None, checks=checks)


# The models live in glm53.preflight.models; the doctor is where callers find them with its checks.
__all__ = [
    "ENGINE_LIBRARIES_CHECK",
    "DoctorFacts",
    "DoctorFinding",
    "DoctorReport",
    "DoctorResult",
    "HostLimits",
    "Requirements",
    "TargetFacts",
    "audit_host",
    "check_containers",
    "limits_from_lock",
    "load_limits",
    "port_error",
    "read_container_facts",
    "read_facts",
    "requirements_for",
    "run_checks",
]
