"""`summary.json`: one versioned report per output directory, each bench command filling its own section.

Writing merges into an existing summary of the same schema (so `bench run`, `needle`, `coherence` and `agent`
can share one directory) and always goes through an atomic replace. Numbers are finite: a value that is not
(NaN, infinity) is written as null, and a summary holding one is refused when read.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import socket
import sys
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from glm53.bench.agent import AgentSection
from glm53.bench.client import ServerInfo
from glm53.bench.coherence import CoherenceSection
from glm53.bench.gates import GateResult
from glm53.bench.needle import NeedleSection
from glm53.bench.runner import RunSection
from glm53.errors import BadInput, Glm53Error, invalid_document
from glm53.fsutil import atomic_write_json, read_json
from glm53.host import gpus as host_gpus
from glm53.proc import TimedOut, environment, run
from glm53.recipe.pins import repro_lock_sha256
from glm53.recipe.profiles import DEFAULT_PROFILE, KEYS, load_profile, read_env_file
from glm53.repro.manifest import Manifest, build_manifest

SCHEMA_VERSION: Literal["glm53.bench/1"] = "glm53.bench/1"
SUMMARY_NAME = "summary.json"

# Engine and planner settings worth recording besides the profile keys (glm53.recipe.profiles.KEYS); values of keys
# that look secret are never copied.
_PLAN_PREFIXES = ("EXL3_", "GLM53_", "VLLM_", "HYBRID_", "CUDA_", "OMP_")
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


class PlanSetting(BaseModel):
    value: str
    origin: str
    source: str


class Environment(BaseModel):
    created_at: str
    hostname: str
    platform: str
    python: str
    glm53_version: str | None
    tool_sha256: str = Field(description="sha256 over the glm53 package's Python sources")
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    driver: str | None = None
    gpu_note: str | None = None
    server: ServerInfo | None = None
    repro_lock_sha256: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    plan_env: dict[str, str] = Field(default_factory=dict, description="engine/planner env keys in force")
    plan_profile: str | None = Field(None, description="the serving profile named with --profile")
    plan: dict[str, PlanSetting] = Field(
        default_factory=dict,
        description="that profile's resolved settings (profile, --env-file, environment)",
    )
    manifest: Manifest | None = Field(None, description="the host manifest (glm53 repro manifest)")


class Summary(BaseModel):
    schema_version: Literal["glm53.bench/1"] = SCHEMA_VERSION
    environment: Environment
    run: RunSection | None = None
    needle: NeedleSection | None = None
    coherence: CoherenceSection | None = None
    agent: AgentSection | None = None
    gates: dict[str, list[GateResult]] = Field(
        default_factory=dict, description="per section ('run', 'needle', ...): the thresholds evaluated"
    )
    non_finite: list[str] = Field(
        default_factory=list,
        description="values written as null because they were not finite numbers: 'path: value'",
    )


def collect_environment(
    server: ServerInfo | None,
    *,
    environ: dict[str, str] | None = None,
    profile: str | None = None,
    env_file: Path | None = None,
) -> Environment:
    env = dict(os.environ if environ is None else environ)
    gpus, driver, note = _gpus()
    commit, dirty = git_state(Path(__file__).resolve().parent)
    return Environment(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        platform=platform.platform(),
        python=sys.version.split()[0],
        glm53_version=_version("glm53"),
        tool_sha256=tool_sha256(),
        gpus=gpus,
        driver=driver,
        gpu_note=note,
        server=server,
        repro_lock_sha256=_repro_lock_sha256(),
        git_commit=commit,
        git_dirty=dirty,
        plan_env=plan_env(env),
        plan_profile=profile,
        plan=resolved_plan(profile, env, env_file) if profile or env_file else {},
        manifest=build_manifest(profile=profile, environ=env),
    )


def resolved_plan(profile: str | None, env: dict[str, str], env_file: Path | None) -> dict[str, PlanSetting]:
    """The serving profile as `glm53 serve` would resolve it here, each value with where it came from."""
    loaded = load_profile(
        profile or DEFAULT_PROFILE, environ=env, env_file=read_env_file(env_file) if env_file else None
    )
    return {
        key: PlanSetting(value=setting.value, origin=setting.origin, source=setting.source)
        for key, setting in loaded.settings.items()
        if not any(marker in key.upper() for marker in _SECRET_MARKERS)
    }


def plan_env(env: dict[str, str]) -> dict[str, str]:
    """The environment's profile keys (glm53.recipe.profiles) and planner variables, so the report shows the
    plan in force."""
    known = frozenset(KEYS)
    chosen = {}
    for key in sorted(env):
        if any(marker in key.upper() for marker in _SECRET_MARKERS):
            continue
        if key in known or key.startswith(_PLAN_PREFIXES):
            chosen[key] = env[key]
    return chosen


def tool_sha256() -> str:
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def summary_path(out_dir: Path) -> Path:
    return Path(out_dir) / SUMMARY_NAME


def load_summary(path: Path) -> Summary:
    """Read a summary (a file, or a directory holding summary.json); errors name the file and the field.

    Another schema version is refused rather than guessed at, and so is a number that is not finite
    (`NaN`, `Infinity`: not JSON, and no report of ours holds one)."""
    path = Path(path)
    if path.is_dir():
        path = summary_path(path)
        if path.exists() and not path.is_file():
            raise BadInput(f"{path} is not a file", fix="pass the report's directory or its summary.json")
    raw = read_json(path, what="bench summary")
    if not isinstance(raw, dict):
        raise BadInput(
            f"{path}: a JSON {type(raw).__name__}, not an object",
            fix="the file is not a glm53 bench summary",
        )
    version = raw.get("schema_version")
    if version is None:
        raise BadInput(f"{path} has no schema_version", fix="the file is not a glm53 bench summary")
    if version != SCHEMA_VERSION:
        raise BadInput(
            f"{path}: schema_version {version!r} is not {SCHEMA_VERSION!r}, the one this glm53 reads",
            fix="compare reports of one schema: re-run the benchmark with this version of glm53, or read "
            "the report with the glm53 that wrote it",
        )
    where = _non_finite(raw)
    if where is not None:
        raise BadInput(
            f"{path}: {where} is not a finite number",
            fix="the report was edited or damaged: re-run the benchmark",
        )
    try:
        return Summary.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, str(path), fix="the file is not a glm53 bench summary") from exc


def _non_finite(value: Any) -> str | None:
    """The dotted path of the first NaN or infinite number in parsed JSON, or None. Iterative: a file nested
    as deep as the JSON reader allows must not exhaust the stack here."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{where or 'the value'} ({item})"
        if isinstance(item, dict):
            children: list[tuple[Any, Any]] = list(item.items())
        elif isinstance(item, list):
            children = list(enumerate(item))
        else:
            continue
        stack.extend((f"{where}.{key}" if where else str(key), child) for key, child in reversed(children))
    return None


def finite_or_none(value: Any, replaced: list[str] | None = None, where: str = "") -> Any:
    """A dumped report with every NaN or infinite number replaced by null (JSON has neither); with `replaced`,
    each replacement is appended to it as 'path: value'."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if replaced is not None:
            replaced.append(f"{where or 'the value'}: {value}")
        return None
    if isinstance(value, dict):
        return {
            key: finite_or_none(item, replaced, f"{where}.{key}" if where else str(key)) for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            finite_or_none(item, replaced, f"{where}.{index}" if where else str(index))
            for index, item in enumerate(value)
        ]
    return value


def json_safe(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` as valid JSON (no NaN, no infinity): each non-finite number becomes null, and a
    `non_finite` list says which and what it was."""
    replaced: list[str] = []
    cleaned: dict[str, Any] = finite_or_none(payload, replaced)
    if replaced:
        cleaned["non_finite"] = [*cleaned.get("non_finite", []), *replaced]
    return cleaned


def prepare_out_dir(out_dir: Path) -> Path:
    """Create `out_dir` and show that a report can be written there, before anything is measured: a path
    that is a file, a summary.json that is not a file, or a directory that refuses writes is exit 2 now,
    not after an hour of measurement."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out {out_dir} is a file, not a directory", fix="pass a directory for the report")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"--out {out_dir}: cannot create the directory: {exc.strerror or exc}",
            fix="pass a directory you can write to",
        ) from exc
    path = summary_path(out_dir)
    if path.exists() and not path.is_file():
        raise BadInput(f"--out {out_dir}: {path} is not a file", fix="move it away, or pass another --out")
    try:
        fd, probe = tempfile.mkstemp(prefix=".glm53-write-check.", dir=out_dir)
    except OSError as exc:
        raise BadInput(
            f"--out {out_dir}: cannot write there: {exc.strerror or exc}",
            fix="pass a directory you can write to",
        ) from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return out_dir


def ensure_same_server(out_dir: Path, server: ServerInfo | None) -> None:
    """Refuse to mix measurements of two servers or models in one summary (checked before measuring)."""
    path = summary_path(out_dir)
    if server is None or not path.exists():
        return
    try:
        previous = load_summary(path).environment.server
    except BadInput as exc:
        raise BadInput(
            f"--out {out_dir} holds a report this glm53 cannot update: {exc.message}",
            fix="pass another --out directory, or move the old report away",
        ) from exc
    if previous is not None and (previous.base_url, previous.model) != (server.base_url, server.model):
        raise BadInput(
            f"--out {out_dir} holds a report of {previous.model} at {previous.base_url}, "
            f"not of {server.model} at {server.base_url}",
            fix="pass another --out directory for this server",
        )


def write_section(out_dir: Path, environment: Environment, **sections: Any) -> Path:
    """Create or update `out_dir/summary.json`: replace the named sections and their gates, keep the rest."""
    out_dir = prepare_out_dir(out_dir)
    path = summary_path(out_dir)
    ensure_same_server(out_dir, environment.server)
    gates: dict[str, list[GateResult]] = sections.pop("gates", {}) or {}
    summary = load_summary(path) if path.exists() else Summary(environment=environment)
    update = {"environment": environment, **sections, "gates": {**summary.gates, **gates}}
    summary = summary.model_copy(update=update)
    dumped = summary.model_dump(mode="json")
    dumped["non_finite"] = []  # this write's replacements, not an earlier write's
    atomic_write_json(path, json_safe(dumped))
    return path


def _gpus() -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(GPUs, driver, note when there are none): never fails the report."""
    try:
        gpus = host_gpus.read_gpus()
    except host_gpus.NoGpu as exc:
        return [], None, str(exc)
    return [gpu.model_dump(mode="json") for gpu in gpus], (gpus[0].driver_version if gpus else None), None


def _repro_lock_sha256() -> str | None:
    try:
        return repro_lock_sha256()
    except Exception:
        return None


def git_state(start: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout holding `start`; (None, None) outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            done = run(
                ["git", "-C", str(start), *args],
                env=environment(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1"),
                what="reading the checkout's commit",
                timeout=10,
            )
        except (Glm53Error, TimedOut):
            return None
        return done.stdout.decode("utf-8", errors="replace") if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    # Modified, staged or untracked files all make the checkout differ from the commit; ignored files do not.
    # The untracked mode is explicit so that a user's status.showUntrackedFiles=no cannot hide them.
    status = git("status", "--porcelain", "--untracked-files=normal")
    return commit.strip(), (bool(status.strip()) if status is not None else None)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
