"""`glm53 repro resolve`: turn the lock's short source commits into full pins (commit + Nix content hash).

For each source pin with `short_rev` set and `rev` or `hash` null, and for `engine.tabbyapi` with `rev` or `hash`
null (or named by `--update`):
1. the full commit: `git fetch --filter=tree:0` of the upstream's branches and tags into a temporary bare
   repository (commits only, no trees or blobs), then `git rev-parse --disambiguate`; no match or more than one
   is an error naming the short hash. (`git ls-remote` lists only ref tips, not every commit.) TabbyAPI has no
   short commit: its `rev` is kept, or, when null or updated, is the upstream's default branch (`git ls-remote
   URL HEAD`), and its `date` is that commit's.
2. the tree: `git fetch --depth=1 URL <commit>` into a second temporary repository (servers that refuse a fetch
   by commit get a plain fetch of their branches and tags instead), then `git archive <commit>`: the tree
   GitHub's tarball holds, so the tree fetchFromGitHub unpacks.
3. the hash: the NAR sha256 of that tree in SRI form (glm53.repro.nar), what the fixed-output fetch checks.

The lock is edited as text (its hand formatting kept) and written atomically; the result is parsed again and
must be the old lock with exactly those fields set. A hash is written only when it was computed here.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_text, read_text_bounded
from glm53.recipe.pins import ReproLock, SourcePin, load_repro_lock
from glm53.repro.nar import nar_hash_tar

SOURCE_PINS = ("vllm", "glm53_overlay")
# Pins that follow the upstream's default branch rather than a published short commit.
HEAD_PINS = ("tabbyapi",)
_SHORT = re.compile(r"^[0-9a-f]{4,40}$")
DEFAULT_TIMEOUT_S = 900.0
# Messages git prints when the server cannot be reached or goes away mid-transfer.
_NETWORK_ERRORS = (
    "could not resolve host",
    "unable to connect",
    "connection refused",
    "connection reset",
    "connection timed out",
    "unable to access",
    "the remote end hung up",
    "early eof",
    "unexpected disconnect",
    "network is unreachable",
    "failed to connect",
    "could not read from remote repository",
    "timed out",
    "fetch-pack: invalid index-pack output",
    "protocol error",
)


class PendingPin(BaseModel):
    name: str
    url: str
    short_rev: str | None  # None: the pin follows the upstream's default branch (HEAD)
    rev: str | None


class ResolvedPin(BaseModel):
    name: str
    url: str
    short_rev: str | None
    rev: str
    hash: str
    date: str | None = None  # the commit's date, for pins that record it


def _wanted(pin: PendingPin) -> str:
    """What is fetched for the pin, for messages."""
    return pin.rev or pin.short_rev or "the newest commit of its default branch"


class ResolvePreview(BaseModel):
    """`glm53 repro resolve --dry-run`'s result (and the result when nothing is pending): what would be fetched."""

    lock: str
    would_fetch: list[PendingPin]
    written: bool = False


class Resolution(BaseModel):
    lock: str
    resolved: list[ResolvedPin]
    diff: str
    written: bool = False


def pending_pins(lock: ReproLock, *, update: tuple[str, ...] = ()) -> list[PendingPin]:
    """Source pins that name a short commit but lack the full commit or its hash; TabbyAPI when its commit or
    hash is null, or when `update` names it (then its newest upstream commit)."""
    unknown = [name for name in update if name not in HEAD_PINS]
    if unknown:
        raise BadInput(
            f"cannot update {', '.join(unknown)}: only {', '.join(HEAD_PINS)} follows an upstream branch",
            hint="the other pins are fixed commits; edit them in the lock",
        )
    pending = []
    for name in SOURCE_PINS:
        pin: SourcePin = getattr(lock.engine, name)
        if pin.short_rev is None or (pin.rev is not None and pin.hash is not None):
            continue
        short = pin.short_rev.lower()
        if not _SHORT.fullmatch(short):
            raise BadInput(
                f"engine.{name}.short_rev {pin.short_rev!r} is not 4 to 40 hex digits", hint="fix it in the lock"
            )
        if pin.rev is not None and not pin.rev.startswith(short):
            raise BadInput(f"engine.{name}: rev {pin.rev} does not start with short_rev {short}")
        pending.append(PendingPin(name=name, url=pin.url, short_rev=short, rev=pin.rev))
    tabby = lock.engine.tabbyapi
    if "tabbyapi" in update or tabby.rev is None or tabby.hash is None:
        rev = None if "tabbyapi" in update else tabby.rev
        pending.append(PendingPin(name="tabbyapi", url=tabby.url, short_rev=None, rev=rev))
    return pending


def describe_fetches(pending: list[PendingPin]) -> str:
    return "; ".join(f"engine.{p.name}: {_wanted(p)} from {p.url}" for p in pending)


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env |= {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    return env


def _git(args: list[str], *, what: str, pin: PendingPin, timeout: float) -> subprocess.CompletedProcess[bytes]:
    try:
        done = subprocess.run(
            ["git", "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60", *args],
            capture_output=True,
            env=_git_env(),
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise Unavailable("git is not installed", hint="install git") from exc
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(
            f"engine.{pin.name}: {what} from {pin.url} took longer than {timeout:.0f} s",
            hint=f"check the network and run again; it would fetch {_wanted(pin)} from {pin.url}",
        ) from exc
    return done


def _fail(done: subprocess.CompletedProcess[bytes], *, what: str, pin: PendingPin) -> None:
    if done.returncode == 0:
        return
    message = done.stderr.decode(errors="replace").strip()
    last = message.splitlines()[-1] if message else f"git exited {done.returncode}"
    if any(marker in message.lower() for marker in _NETWORK_ERRORS):
        raise Unavailable(
            f"engine.{pin.name}: {what} from {pin.url} failed: {last}",
            hint=f"run again where {pin.url} is reachable; it would fetch {_wanted(pin)} (nothing was written)",
        )
    raise BadInput(f"engine.{pin.name}: {what} from {pin.url} failed: {last}")


_REFSPECS = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]


def full_commit(pin: PendingPin, work: Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The one commit upstream whose id starts with the short one (from the upstream's branches and tags); for a
    pin without a short commit, the tip of the upstream's default branch."""
    if pin.rev is not None:
        return pin.rev
    if pin.short_rev is None:
        return _head_commit(pin, timeout=timeout)
    repo = work / f"{pin.name}-commits.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, env=_git_env())
    done = _git(
        ["-C", str(repo), "fetch", "-q", "--no-tags", "--filter=tree:0", pin.url, *_REFSPECS],
        what="listing commits",
        pin=pin,
        timeout=timeout,
    )
    _fail(done, what="listing commits", pin=pin)
    listed = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--disambiguate=" + pin.short_rev],
        capture_output=True,
        env=_git_env(),
        check=False,
    )
    candidates = sorted(set(listed.stdout.decode().split()))
    commits = [
        oid
        for oid in candidates
        if subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-t", oid], capture_output=True, env=_git_env(), check=False
        ).stdout.strip()
        == b"commit"
    ]
    if not commits:
        raise BadInput(
            f"engine.{pin.name}: no commit {pin.short_rev} on any branch or tag of {pin.url}",
            hint="check short_rev and url in the lock (the commit may live only in a fork)",
        )
    if len(commits) > 1:
        raise BadInput(
            f"engine.{pin.name}: short commit {pin.short_rev} is ambiguous at {pin.url}: " + ", ".join(commits),
            hint="set a longer short_rev (or rev) in the lock",
        )
    return commits[0]


def _head_commit(pin: PendingPin, *, timeout: float) -> str:
    done = _git(["ls-remote", pin.url, "HEAD"], what="reading HEAD", pin=pin, timeout=timeout)
    _fail(done, what="reading HEAD", pin=pin)
    fields = done.stdout.decode(errors="replace").split()
    if len(fields) < 2 or fields[1] != "HEAD" or not re.fullmatch(r"[0-9a-f]{40}", fields[0]):
        raise BadInput(f"engine.{pin.name}: {pin.url} names no default branch (HEAD)", hint="set rev in the lock")
    return fields[0]


def commit_date(pin: PendingPin, rev: str, work: Path) -> str:
    """The committer date (YYYY-MM-DD) of `rev`, read from the repository `tree_hash` fetched it into."""
    shown = subprocess.run(
        ["git", "-C", str(work / f"{pin.name}-tree.git"), "log", "-1", "--format=%cs", rev],
        capture_output=True,
        env=_git_env(),
        check=False,
    )
    date = shown.stdout.decode().strip()
    if shown.returncode != 0 or not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date):
        raise BadInput(f"engine.{pin.name}: cannot read the date of {rev}: {shown.stderr.decode(errors='replace')}")
    return date


def tree_hash(pin: PendingPin, rev: str, work: Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The NAR sha256 (SRI) of the tree `git archive rev` gives, fetched from the upstream."""
    repo = work / f"{pin.name}-tree.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, env=_git_env())
    done = _git(
        ["-C", str(repo), "fetch", "-q", "--no-tags", "--depth=1", pin.url, rev],
        what=f"fetching {rev}",
        pin=pin,
        timeout=timeout,
    )
    if done.returncode != 0 and any(m in done.stderr.lower() for m in (b"not our ref", b"unadvertised object")):
        done = _git(
            ["-C", str(repo), "fetch", "-q", "--no-tags", pin.url, *_REFSPECS],
            what=f"fetching {rev}",
            pin=pin,
            timeout=timeout,
        )
    _fail(done, what=f"fetching {rev}", pin=pin)
    tarball = work / f"{pin.name}.tar"
    with tarball.open("wb") as out:
        archived = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", rev],
            stdout=out,
            stderr=subprocess.PIPE,
            env=_git_env(),
            check=False,
        )
    if archived.returncode != 0:
        raise BadInput(f"engine.{pin.name}: git archive {rev}: {archived.stderr.decode(errors='replace').strip()}")
    with tarball.open("rb") as handle:
        return nar_hash_tar(handle)


def resolve_pins(
    pending: list[PendingPin], *, timeout: float = DEFAULT_TIMEOUT_S, work_dir: Path | None = None
) -> list[ResolvedPin]:
    resolved = []
    with tempfile.TemporaryDirectory(prefix="glm53-resolve-", dir=work_dir) as tmp:
        for pin in pending:
            rev = full_commit(pin, Path(tmp), timeout=timeout)
            digest = tree_hash(pin, rev, Path(tmp), timeout=timeout)
            date = commit_date(pin, rev, Path(tmp)) if pin.name in HEAD_PINS else None
            resolved.append(
                ResolvedPin(name=pin.name, url=pin.url, short_rev=pin.short_rev, rev=rev, hash=digest, date=date)
            )
    return resolved


# -- the lock edit ----------------------------------------------------------------------------------


def _object_span(text: str, start: int) -> tuple[int, int]:
    """(open, close+1) of the JSON object whose `{` is the first at or after `start`."""
    open_at = text.index("{", start)
    depth, i, in_string = 0, open_at, False
    while i < len(text):
        char = text[i]
        if in_string:
            if char == "\\":
                i += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return open_at, i + 1
        i += 1
    raise ValueError("unbalanced JSON object")


def _set_field(text: str, path: tuple[str, ...], key: str, value: str) -> str:
    start = 0
    end = len(text)
    for name in path:
        found = re.compile(r'"' + re.escape(name) + r'"\s*:\s*\{').search(text, start, end)
        if found is None:
            raise ValueError(f"{'.'.join(path)} not found")
        start, end = _object_span(text, found.start())
    field = re.compile(r'("' + re.escape(key) + r'"\s*:\s*)(null|"[^"\\]*")').search(text, start, end)
    if field is None:
        raise ValueError(f"{'.'.join(path)}.{key} not found")
    return text[: field.start()] + field.group(1) + json.dumps(value) + text[field.end() :]


def updated_lock_text(text: str, resolved: list[ResolvedPin]) -> str:
    """The lock's text with each pin's rev and hash set, every other byte unchanged; checked by parsing."""
    new = text
    expected = json.loads(text)
    for pin in resolved:
        fields = [("rev", pin.rev), ("hash", pin.hash)] + ([("date", pin.date)] if pin.date is not None else [])
        for key, value in fields:
            new = _set_field(new, ("engine", pin.name), key, value)
            expected["engine"][pin.name][key] = value
    if json.loads(new) != expected:
        raise ValueError("the edited lock does not parse to the intended values")
    ReproLock.model_validate(expected)
    return new


def lock_diff(path: Path, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path.name}", f"b/{path.name}"
        )
    )


def plan_resolution(
    path: Path, *, timeout: float = DEFAULT_TIMEOUT_S, update: tuple[str, ...] = ()
) -> tuple[Resolution, str, str]:
    """Resolve every pending pin of the lock at `path`: (the result with its diff, the old text, the new text).
    Writes nothing."""
    lock = load_repro_lock(path)
    pending = pending_pins(lock, update=update)
    old = read_text_bounded(path, what="repro lock")
    if not pending:
        return Resolution(lock=str(path), resolved=[], diff=""), old, old
    resolved = resolve_pins(pending, timeout=timeout)
    try:
        new = updated_lock_text(old, resolved)
    except ValueError as exc:
        raise BadInput(f"repro lock {path}: cannot set the pins in place ({exc})", hint="restore the file") from exc
    return Resolution(lock=str(path), resolved=resolved, diff=lock_diff(path, old, new)), old, new


def write_resolution(path: Path, old: str, new: str) -> None:
    """Write `new` unless the file changed since `old` was read."""
    if read_text_bounded(path, what="repro lock") != old:
        raise BadInput(f"repro lock {path} changed while the pins were resolved", hint="run again")
    atomic_write_text(path, new)


__all__ = [
    "HEAD_PINS",
    "PendingPin",
    "Resolution",
    "ResolvePreview",
    "ResolvedPin",
    "commit_date",
    "describe_fetches",
    "full_commit",
    "pending_pins",
    "plan_resolution",
    "resolve_pins",
    "tree_hash",
    "updated_lock_text",
    "write_resolution",
]
