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

The vendor image (`engine.vllm.image`, pinned by digest) has its Nix hash filled the way Nix itself computes
it: the flake next to the lock pulls it once with dockerTools.pullImage and a placeholder hash
(`nix build DIR#image.probe`), and the hash Nix reports for what it pulled is written (the image is a
docker-archive skopeo writes, which only that same pull reproduces).

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
from subprocess import CompletedProcess
from typing import IO

from pydantic import BaseModel

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_text, read_text_bounded
from glm53.proc import BASE_ENV, GIT_SCHEMES, NETWORK_ENV, TimedOut, check_commit, check_url, environment, run, text
from glm53.recipe.pins import ReproLock, SourcePin, load_repro_lock
from glm53.repro.nar import nar_hash_tar
from glm53.safetext import shown

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


class PendingImage(BaseModel):
    """The vendor image whose Nix hash is still null: pulled by `flake`'s `image.probe`."""

    reference: str
    digest: str
    flake: str


class ResolvedImage(BaseModel):
    reference: str
    digest: str
    hash: str


class ResolvePreview(BaseModel):
    """`glm53 repro resolve --dry-run`'s result (and the result when nothing is pending): what would be fetched,
    and the vendor image that would be pulled for its hash."""

    lock: str
    would_fetch: list[PendingPin]
    would_pull: PendingImage | None = None
    written: bool = False


class Resolution(BaseModel):
    lock: str
    resolved: list[ResolvedPin]
    image: ResolvedImage | None = None
    diff: str
    written: bool = False


def pending_pins(lock: ReproLock, *, update: tuple[str, ...] = ()) -> list[PendingPin]:
    """Source pins that name a short commit but lack the full commit or its hash; TabbyAPI when its commit or
    hash is null, or when `update` names it (then its newest upstream commit)."""
    unknown = [name for name in update if name not in HEAD_PINS]
    if unknown:
        raise BadInput(
            f"cannot update {', '.join(unknown)}: only {', '.join(HEAD_PINS)} follows an upstream branch",
            fix="the other pins are fixed commits; edit them in the lock",
        )
    pending = []
    for name in SOURCE_PINS:
        pin: SourcePin = getattr(lock.engine, name)
        if pin.short_rev is None or (pin.rev is not None and pin.hash is not None):
            continue
        short = pin.short_rev.lower()
        if not _SHORT.fullmatch(short):
            raise BadInput(
                f"engine.{name}.short_rev {pin.short_rev!r} is not 4 to 40 hex digits", fix="fix it in the lock"
            )
        if pin.rev is not None and not pin.rev.startswith(short):
            raise BadInput(f"engine.{name}: rev {pin.rev} does not start with short_rev {short}")
        url = check_url(pin.url, what=f"engine.{name}.url")
        pending.append(PendingPin(name=name, url=url, short_rev=short, rev=pin.rev))
    tabby = lock.engine.tabbyapi
    if "tabbyapi" in update or tabby.rev is None or tabby.hash is None:
        rev = None if "tabbyapi" in update else tabby.rev
        url = check_url(tabby.url, what="engine.tabbyapi.url")
        pending.append(PendingPin(name="tabbyapi", url=url, short_rev=None, rev=rev))
    return pending


def describe_fetches(pending: list[PendingPin], image: PendingImage | None = None) -> str:
    fetches = [f"engine.{p.name}: {_wanted(p)} from {shown(p.url)}" for p in pending]
    if image is not None:
        fetches.append(
            f"engine.vllm.image.hash: pull {image.reference} ({image.digest}) with {image.flake}#image.probe"
        )
    return "; ".join(fetches)


IMAGE_PROBE = "image.probe"
_GOT = re.compile(r"got:\s+(sha256-[A-Za-z0-9+/]{43}=)")


def pending_image(lock: ReproLock, lock_path: Path) -> PendingImage | None:
    """The vendor image when its hash is null; the flake that pulls it is the one next to the lock."""
    image = lock.engine.vllm.image
    if image is None or image.hash is not None:
        return None
    flake = lock_path.resolve().parent
    return PendingImage(reference=image.reference, digest=image.digest, flake=str(flake))


def image_hash(image: PendingImage, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """Pull the image once with Nix (a placeholder hash) and return the hash Nix reports for it."""
    if not (Path(image.flake) / "flake.nix").is_file():
        raise BadInput(
            f"engine.vllm.image.hash: {image.flake} has no flake.nix to pull the image with",
            fix="resolve the lock of the glm53 repository, inside it",
        )
    argv = [
        "nix",
        "--extra-experimental-features",
        "nix-command flakes",
        "build",
        "--no-link",
        f"{image.flake}#{IMAGE_PROBE}",
    ]
    # Nix's own settings (NIX_*, XDG_*), a proxy and certificates: the rest of our environment stays here.
    own = [name for name in os.environ if name.startswith(("NIX_", "XDG_"))]
    try:
        done = run(
            argv,
            env=environment((*BASE_ENV, *NETWORK_ENV, *own)),
            what="engine.vllm.image.hash",
            timeout=timeout,
            missing_fix="the image's hash is what Nix computes: install Nix",
        )
    except TimedOut as exc:
        raise Unavailable(
            f"engine.vllm.image.hash: pulling {image.reference} took longer than {timeout:.0f} s",
            fix="run again with a longer --timeout (the image is several GB); nothing was written",
        ) from exc
    found = _GOT.search((done.stderr or b"").decode("utf-8", errors="replace"))
    if found is not None:
        return found.group(1)
    lines = text(done.stderr).splitlines()
    raise Unavailable(
        f"engine.vllm.image.hash: nix could not pull {image.reference}: "
        + (lines[-1] if lines else f"exit {done.returncode}"),
        fix=f"run again where the registry is reachable; it pulls {image.digest} (nothing was written)",
    )


# The variables git may see: ours for programs, home, proxies and certificates; the user's own git settings
# through GIT_CONFIG_COUNT/KEY_n/VALUE_n and an ssh command; nothing else (GIT_DIR and the like would point
# git elsewhere).
_GIT_KEEP = (*BASE_ENV, *NETWORK_ENV, "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH")


def _git_env() -> dict[str, str]:
    user_config = [name for name in os.environ if re.fullmatch(r"GIT_CONFIG_(COUNT|KEY_[0-9]+|VALUE_[0-9]+)", name)]
    return environment(
        (*_GIT_KEEP, *user_config),
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="true",
        LC_ALL="C",
        GIT_CONFIG_NOSYSTEM="1",
        # No transport that runs a command (ext::) or reads a descriptor (fd::), whatever a config says.
        GIT_ALLOW_PROTOCOL=":".join(GIT_SCHEMES),
    )


def _local_git(
    args: list[str], *, what: str, stdout: int | IO[bytes] | None = subprocess.PIPE
) -> CompletedProcess[bytes]:
    """git on a repository of our own temp dir (init, rev-parse, cat-file, log, archive)."""
    return run(["git", *args], env=_git_env(), what=what, stdout=stdout, missing_fix="install git")


def _git(args: list[str], *, what: str, pin: PendingPin, timeout: float) -> CompletedProcess[bytes]:
    """git talking to the pin's upstream, bounded by `timeout` (the whole process group is killed at its end)."""
    check_url(pin.url, what=f"engine.{pin.name}.url")
    try:
        return run(
            ["git", "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60", *args],
            env=_git_env(),
            what=f"engine.{pin.name}: {what}",
            timeout=timeout,
            missing_fix="install git",
        )
    except TimedOut as exc:
        raise Unavailable(
            f"engine.{pin.name}: {what} from {shown(pin.url)} took longer than {timeout:.0f} s",
            fix=f"check the network and run again; it would fetch {_wanted(pin)} from {shown(pin.url)}",
        ) from exc


def _fail(done: CompletedProcess[bytes], *, what: str, pin: PendingPin) -> None:
    if done.returncode == 0:
        return
    message = text(done.stderr)
    last = message.splitlines()[-1] if message else f"git exited {done.returncode}"
    if any(marker in message.lower() for marker in _NETWORK_ERRORS):
        raise Unavailable(
            f"engine.{pin.name}: {what} from {shown(pin.url)} failed: {last}",
            fix=f"run again where {shown(pin.url)} is reachable; it would fetch {_wanted(pin)} (nothing was written)",
        )
    raise BadInput(f"engine.{pin.name}: {what} from {shown(pin.url)} failed: {last}")


_REFSPECS = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]


def _init(repo: Path) -> None:
    done = _local_git(["init", "-q", "--bare", "--", str(repo)], what="creating a scratch repository")
    if done.returncode != 0:
        raise Unavailable(f"git init {repo} failed: {text(done.stderr)}")


def full_commit(pin: PendingPin, work: Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The one commit upstream whose id starts with the short one (from the upstream's branches and tags); for a
    pin without a short commit, the tip of the upstream's default branch."""
    if pin.rev is not None:
        return pin.rev
    if pin.short_rev is None:
        return _head_commit(pin, timeout=timeout)
    repo = work / f"{pin.name}-commits.git"
    _init(repo)
    done = _git(
        ["-C", str(repo), "fetch", "-q", "--no-tags", "--filter=tree:0", "--end-of-options", pin.url, *_REFSPECS],
        what="listing commits",
        pin=pin,
        timeout=timeout,
    )
    _fail(done, what="listing commits", pin=pin)
    short = check_commit(pin.short_rev, what=f"engine.{pin.name}.short_rev")
    listed = _local_git(["-C", str(repo), "rev-parse", "--disambiguate=" + short], what="listing candidates")
    candidates = [oid for oid in sorted(set(listed.stdout.decode().split())) if re.fullmatch("[0-9a-f]{40,64}", oid)]
    commits = [
        oid
        for oid in candidates
        if _local_git(["-C", str(repo), "cat-file", "-t", oid], what="listing candidates").stdout.strip() == b"commit"
    ]
    if not commits:
        raise BadInput(
            f"engine.{pin.name}: no commit {pin.short_rev} on any branch or tag of {shown(pin.url)}",
            fix="check short_rev and url in the lock (the commit may live only in a fork)",
        )
    if len(commits) > 1:
        raise BadInput(
            f"engine.{pin.name}: short commit {pin.short_rev} is ambiguous at {shown(pin.url)}: " + ", ".join(commits),
            fix="set a longer short_rev (or rev) in the lock",
        )
    return commits[0]


def _head_commit(pin: PendingPin, *, timeout: float) -> str:
    done = _git(["ls-remote", "--end-of-options", pin.url, "HEAD"], what="reading HEAD", pin=pin, timeout=timeout)
    _fail(done, what="reading HEAD", pin=pin)
    fields = done.stdout.decode(errors="replace").split()
    if len(fields) < 2 or fields[1] != "HEAD" or not re.fullmatch(r"[0-9a-f]{40}", fields[0]):
        raise BadInput(f"engine.{pin.name}: {shown(pin.url)} names no default branch (HEAD)", fix="set rev in the lock")
    return fields[0]


def commit_date(pin: PendingPin, rev: str, work: Path) -> str:
    """The committer date (YYYY-MM-DD) of `rev`, read from the repository `tree_hash` fetched it into."""
    check_commit(rev, what=f"engine.{pin.name}.rev")
    logged = _local_git(
        ["-C", str(work / f"{pin.name}-tree.git"), "log", "-1", "--format=%cs", "--end-of-options", rev, "--"],
        what="reading the commit date",
    )
    date = logged.stdout.decode(errors="replace").strip()
    if logged.returncode != 0 or not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date):
        raise BadInput(f"engine.{pin.name}: cannot read the date of {rev}: {text(logged.stderr)}")
    return date


def tree_hash(pin: PendingPin, rev: str, work: Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """The NAR sha256 (SRI) of the tree `git archive rev` gives, fetched from the upstream."""
    check_commit(rev, what=f"engine.{pin.name}.rev")
    repo = work / f"{pin.name}-tree.git"
    _init(repo)
    done = _git(
        ["-C", str(repo), "fetch", "-q", "--no-tags", "--depth=1", "--end-of-options", pin.url, rev],
        what=f"fetching {rev}",
        pin=pin,
        timeout=timeout,
    )
    if done.returncode != 0 and any(m in done.stderr.lower() for m in (b"not our ref", b"unadvertised object")):
        done = _git(
            ["-C", str(repo), "fetch", "-q", "--no-tags", "--end-of-options", pin.url, *_REFSPECS],
            what=f"fetching {rev}",
            pin=pin,
            timeout=timeout,
        )
    _fail(done, what=f"fetching {rev}", pin=pin)
    tarball = work / f"{pin.name}.tar"
    with tarball.open("wb") as out:
        archived = _local_git(
            ["-C", str(repo), "archive", "--format=tar", "--end-of-options", rev], what="archiving", stdout=out
        )
    if archived.returncode != 0:
        raise BadInput(f"engine.{pin.name}: git archive {rev}: {text(archived.stderr)}")
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


def json_object_span(text: str, start: int) -> tuple[int, int]:
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
        start, end = json_object_span(text, found.start())
    field = re.compile(r'("' + re.escape(key) + r'"\s*:\s*)(null|"[^"\\]*")').search(text, start, end)
    if field is None:
        raise ValueError(f"{'.'.join(path)}.{key} not found")
    return text[: field.start()] + field.group(1) + json.dumps(value) + text[field.end() :]


def updated_lock_text(text: str, resolved: list[ResolvedPin], image: ResolvedImage | None = None) -> str:
    """The lock's text with each pin's rev and hash (and the image's hash) set, every other byte unchanged;
    checked by parsing."""
    new = text
    expected = json.loads(text)
    for pin in resolved:
        fields = [("rev", pin.rev), ("hash", pin.hash)] + ([("date", pin.date)] if pin.date is not None else [])
        for key, value in fields:
            new = _set_field(new, ("engine", pin.name), key, value)
            expected["engine"][pin.name][key] = value
    if image is not None:
        new = _set_field(new, ("engine", "vllm", "image"), "hash", image.hash)
        expected["engine"]["vllm"]["image"]["hash"] = image.hash
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
    wanted_image = pending_image(lock, path)
    old = read_text_bounded(path, what="repro lock")
    if not pending and wanted_image is None:
        return Resolution(lock=str(path), resolved=[], diff=""), old, old
    resolved = resolve_pins(pending, timeout=timeout)
    image = None
    if wanted_image is not None:
        image = ResolvedImage(
            reference=wanted_image.reference,
            digest=wanted_image.digest,
            hash=image_hash(wanted_image, timeout=timeout),
        )
    try:
        new = updated_lock_text(old, resolved, image)
    except ValueError as exc:
        raise BadInput(f"repro lock {path}: cannot set the pins in place ({exc})", fix="restore the file") from exc
    return Resolution(lock=str(path), resolved=resolved, image=image, diff=lock_diff(path, old, new)), old, new


def write_resolution(path: Path, old: str, new: str) -> None:
    """Write `new` unless the file changed since `old` was read."""
    if read_text_bounded(path, what="repro lock") != old:
        raise BadInput(f"repro lock {path} changed while the pins were resolved", fix="run again")
    atomic_write_text(path, new)


__all__ = [
    "HEAD_PINS",
    "IMAGE_PROBE",
    "PendingImage",
    "PendingPin",
    "Resolution",
    "ResolvePreview",
    "ResolvedImage",
    "ResolvedPin",
    "commit_date",
    "describe_fetches",
    "full_commit",
    "image_hash",
    "pending_image",
    "pending_pins",
    "plan_resolution",
    "resolve_pins",
    "tree_hash",
    "updated_lock_text",
    "write_resolution",
]
