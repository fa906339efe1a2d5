"""The checkpoint lock: every file of a checkpoint by relative path, with its size and SHA-256, and for
safetensors files the tensor count and the SHA-256 of the JSON header.

A lock is made from a local directory (hashing every file) or from the Hub's file metadata at a pinned
revision (each LFS file's sha256 and size; small non-LFS files and the safetensors headers are fetched with
HTTP range requests, so no weights are downloaded). It lives by default at DIR/checkpoint.lock.json; the lock
file itself, huggingface_hub's `.cache/` folder and the index backup made by `glm53 model install` are not
part of the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from glm53.checkpoint.hashing import HashProgress, hash_with_cache
from glm53.checkpoint.safetensors_header import MAX_HEADER_SIZE, parse_header_bytes, read_safetensors_header
from glm53.errors import BadInput, Glm53Error, Unavailable, invalid_document
from glm53.fsutil import atomic_write_json, parse_json, read_json, resolve_inside, safe_relative_path

LOCK_FILENAME = "checkpoint.lock.json"
LOCK_SCHEMA_VERSION: Literal[1] = 1
INDEX_NAME = "model.safetensors.index.json"
INDEX_BACKUP_NAME = "model.safetensors.index.shards-only.json"
# Top-level folders that are tool state, not checkpoint content: huggingface_hub's download state, and
# a git clone's object store (which holds a second copy of every LFS file).
IGNORED_FOLDERS = (".cache", ".git")
FULL_REVISION = re.compile(r"[0-9a-f]{40}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Non-LFS files fetched whole to hash them when locking from the Hub (configs, index, tokenizer).
MAX_INLINE_FETCH = 64 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LockedSafetensors(_Strict):
    tensors: int = Field(ge=0)
    header_sha256: str

    @field_validator("header_sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        return _check_sha(value)


class LockedFile(_Strict):
    path: str
    size: int = Field(ge=0)
    sha256: str
    safetensors: LockedSafetensors | None = None

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        try:
            safe_relative_path(value, what="lock entry")
        except BadInput as exc:
            raise ValueError(exc.message) from exc
        if is_tool_file(value):  # the lock itself, `.cache/` (partial downloads), `.git/`: never content
            raise ValueError(f"path {value!r} is a tool file, not checkpoint content")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        return _check_sha(value)


class CheckpointLock(_Strict):
    schema_version: Literal[1] = LOCK_SCHEMA_VERSION
    repo: str | None = None
    revision: str | None = None
    source: Literal["local", "hub"]
    total_size: int = Field(ge=0)
    files: list[LockedFile]

    @model_validator(mode="after")
    def _consistent(self) -> CheckpointLock:
        seen: set[str] = set()
        for entry in self.files:
            if entry.path in seen:
                raise ValueError(f"path {entry.path!r} is listed twice")
            seen.add(entry.path)
        if self.total_size != sum(f.size for f in self.files):
            raise ValueError("total_size is not the sum of the file sizes")
        if self.revision is not None and not FULL_REVISION.fullmatch(self.revision):
            raise ValueError(f"revision {self.revision!r} is not a full 40-hex commit")
        return self

    def by_path(self) -> dict[str, LockedFile]:
        return {f.path: f for f in self.files}


def _check_sha(value: str) -> str:
    if not SHA256_HEX.fullmatch(value):
        raise ValueError(f"{value!r} is not a lowercase 64-hex SHA-256")
    return value


def default_lock_path(model_dir: Path) -> Path:
    return Path(model_dir) / LOCK_FILENAME


def is_tool_file(relative: str) -> bool:
    """Not checkpoint content: the lock, the index backup, git metadata, tool caches (`.cache/`, `.git/`)."""
    parts = PurePosixPath(relative).parts
    top_level = (LOCK_FILENAME, INDEX_BACKUP_NAME, ".gitattributes")
    return relative in top_level or (bool(parts) and parts[0] in IGNORED_FOLDERS)


def require_full_revision(revision: str) -> str:
    if not FULL_REVISION.fullmatch(revision):
        raise BadInput(
            f"--revision {revision!r} is not a full 40-hex commit",
            hint="pin the commit, e.g. --revision 332ab457b709b7ba30dd9a448be5de03b80a7ac9",
        )
    return revision


def load_lock(path: Path) -> CheckpointLock:
    raw = read_json(path, what="checkpoint lock")
    try:
        return CheckpointLock.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"checkpoint lock {path}", hint="regenerate it with `glm53 model lock`") from exc


def write_lock(lock: CheckpointLock, path: Path, *, force: bool = False) -> None:
    if path.exists() and not force:
        raise BadInput(f"{path} already exists", hint="pass --force to replace it")
    atomic_write_json(path, lock.model_dump(mode="json"), overwrite=force)


def checkpoint_files(model_dir: Path) -> list[str]:
    """Relative paths of the checkpoint's files (sorted), refusing symlinks that leave the directory.

    A symlinked sub-directory is followed when it stays inside the directory (its files are listed under the
    link's path, as a loader sees them) and refused when it leads outside or back into one of its own parents;
    an unreadable sub-directory is refused too: nothing is skipped silently.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise BadInput(f"model directory not found: {root}")
    root_real = root.resolve()
    found: list[str] = []

    def walk(rel_dir: PurePosixPath, ancestors: tuple[Path, ...]) -> None:
        directory = root / rel_dir
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise BadInput(
                f"model directory: cannot list {directory}: {exc.strerror}",
                hint="make it readable, or move it out of the model directory",
            ) from exc
        for entry in entries:
            relative = rel_dir / entry.name
            rel = relative.as_posix()
            if is_tool_file(rel) or (rel_dir == PurePosixPath(".") and entry.name in IGNORED_FOLDERS):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if is_dir:
                real = Path(entry.path).resolve()
                if entry.is_symlink():
                    if real != root_real and root_real not in real.parents:
                        raise BadInput(
                            f"model directory: {rel} is a symlink to {os.readlink(entry.path)}, "
                            f"a directory outside {root}",
                            hint="replace the link with the directory itself, or move the link out",
                        )
                    if real in ancestors:
                        raise BadInput(
                            f"model directory: {rel} is a symlink to {os.readlink(entry.path)}, "
                            "which loops back to a directory containing it",
                            hint="remove the link",
                        )
                walk(relative, (*ancestors, real))
                continue
            if _is_temp_file(entry.name):
                continue
            full = resolve_inside(root, relative, what="model directory")
            if full.is_file():
                found.append(rel)

    walk(PurePosixPath("."), (root_real,))
    return sorted(found)


def _is_temp_file(name: str) -> bool:
    # Temp files of our own atomic writes (".NAME.xxxx.tmp").
    return name.startswith(".") and name.endswith(".tmp")


def lock_from_directory(
    model_dir: Path,
    *,
    repo: str | None = None,
    revision: str | None = None,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: HashProgress | None = None,
) -> CheckpointLock:
    root = Path(model_dir)
    relatives = checkpoint_files(root)
    if not relatives:
        raise BadInput(f"{root} holds no files to lock")
    if revision is not None:
        require_full_revision(revision)
    paths = {rel: root / rel for rel in relatives}
    outcome = hash_with_cache(list(paths.values()), jobs=jobs, use_cache=use_cache, progress=progress)
    if outcome.changed_while_hashing or outcome.vanished:
        changed = ", ".join(str(p) for p in [*outcome.changed_while_hashing, *outcome.vanished])
        raise Glm53Error(
            f"files changed, vanished or stopped being regular files while being hashed: {changed}",
            hint="wait for writers to finish, then lock again",
        )
    files = []
    for rel, path in paths.items():
        st_info = None
        if rel.endswith(".safetensors"):
            header = read_safetensors_header(path)
            st_info = LockedSafetensors(tensors=len(header.tensors), header_sha256=header.header_sha256)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise Glm53Error(f"{path} vanished while being locked", hint="wait for writers to finish") from exc
        files.append(LockedFile(path=rel, size=size, sha256=outcome.sha256[path], safetensors=st_info))
    return CheckpointLock(
        repo=repo, revision=revision, source="local", total_size=sum(f.size for f in files), files=files
    )


class _HubLfs(BaseModel):
    sha256: str
    size: int


class _HubSibling(BaseModel):
    rfilename: str
    size: int | None = None
    lfs: _HubLfs | None = None


class _HubModelInfo(BaseModel):
    """The two fields of the Hub's model-info answer a lock needs; the rest is ignored."""

    sha: str | None = None
    siblings: list[_HubSibling] | None = None


# The most a Hub API answer (JSON) may hold: a repository's file list is kilobytes, not gigabytes.
MAX_API_ANSWER = 64 * 1024 * 1024


def _read_limited(response: Any, limit: int) -> bytes:
    """At most `limit` bytes of a streamed response's body (a server may send more than asked)."""
    chunks: list[bytes] = []
    have = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        have += len(chunk)
        if have >= limit:
            break
    return b"".join(chunks)[:limit]


def _not_the_hub(url: str, response: Any, what: str, endpoint: str | None) -> Unavailable:
    content_type = response.headers.get("Content-Type") or "no Content-Type"
    return Unavailable(
        f"{url} answered something that is not the Hub's API ({what}; {content_type})",
        hint=f"check HF_ENDPOINT (now {endpoint or 'unset: https://huggingface.co'}) and that no proxy or "
        "captive portal (a hotel or office login page) intercepts the connection",
    )


def _api_timeout() -> float:
    from huggingface_hub import constants

    return float(max(30, constants.HF_HUB_DOWNLOAD_TIMEOUT))


def _model_info(session: Any, repo: str, revision: str, endpoint: str | None, headers: dict[str, str]) -> _HubModelInfo:
    """GET /api/models/REPO/revision/REV?blobs=true, read bounded and parsed by the one JSON reader."""
    from huggingface_hub import constants, hf_raise_for_status

    base = (endpoint or constants.ENDPOINT).rstrip("/")
    url = f"{base}/api/models/{repo}/revision/{revision}"
    with session.stream(
        "GET", url, params={"blobs": "true"}, headers=headers, follow_redirects=True, timeout=_api_timeout()
    ) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        raw = _read_limited(response, MAX_API_ANSWER + 1)
        if len(raw) > MAX_API_ANSWER:
            raise _not_the_hub(url, response, f"more than {MAX_API_ANSWER:,} bytes", endpoint)
        try:
            parsed = parse_json(raw, what=f"the Hub's answer from {url}")
            return _HubModelInfo.model_validate(parsed)
        except BadInput as exc:
            raise _not_the_hub(url, response, exc.message.rsplit(": ", 1)[-1][:200], endpoint) from exc
        except ValidationError as exc:
            bad = invalid_document(exc, "model info")
            raise _not_the_hub(url, response, bad.message, endpoint) from exc


def lock_from_hub(
    repo: str, revision: str, *, endpoint: str | None = None, token: str | bool | None = None
) -> CheckpointLock:
    """A lock from the Hub's metadata at `revision`, reading only headers and small files."""
    from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status

    require_full_revision(revision)
    require_repo_id(repo)
    endpoint = hub_endpoint(endpoint)
    with hub_errors(repo, revision):
        session = get_session()
        headers = hub_headers(token)
        info = _model_info(session, repo, revision, endpoint, headers)
        if info.sha != revision:
            raise BadInput(f"the Hub answered revision {info.sha} for {repo}@{revision}")

        def fetch(filename: str, start: int, end: int) -> bytes:
            try:
                return fetch_range(filename, start, end)
            except Exception as exc:
                if type(exc).__module__.startswith(("httpx", "httpcore", "h11")):
                    raise Unavailable(
                        f"cannot read {repo}/{filename} (bytes {start}-{end - 1}) from the Hub: {exc}",
                        hint="check the network, or HF_ENDPOINT; then run the same command again",
                    ) from exc
                raise

        def fetch_range(filename: str, start: int, end: int) -> bytes:
            url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
            with session.stream(
                "GET",
                url,
                headers={**headers, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"},
                follow_redirects=True,
                timeout=_api_timeout(),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
                if response.status_code == 206:
                    content_range = response.headers.get("Content-Range", "")
                    if not content_range.startswith(f"bytes {start}-"):
                        raise _not_the_hub(
                            url, response, f"asked bytes {start}-{end - 1}, got {content_range!r}", endpoint
                        )
                    data = _read_limited(response, end - start)
                else:  # the server ignored the range: read no more than the bytes wanted
                    data = _read_limited(response, end)[start:end]
            if len(data) != end - start:
                raise Unavailable(
                    f"{repo}/{filename}: asked bytes {start}-{end - 1}, got {len(data)} bytes",
                    hint="the connection broke or the server is not the Hub: try again, check HF_ENDPOINT",
                )
            return data

        files: list[LockedFile] = []
        for sibling in sorted(info.siblings or [], key=lambda s: s.rfilename):
            name = sibling.rfilename
            safe_relative_path(name, what=f"Hub file list of {repo}")
            if is_tool_file(name):
                continue
            if sibling.lfs is not None:
                size, sha = int(sibling.lfs.size), str(sibling.lfs.sha256)
            else:
                if sibling.size is None:
                    raise Glm53Error(f"the Hub gave no size for {repo}/{name}")
                if sibling.size > MAX_INLINE_FETCH:
                    raise Glm53Error(f"{repo}/{name} is {sibling.size} bytes and not in LFS: no hash without download")
                size = int(sibling.size)
                sha = hashlib.sha256(fetch(name, 0, size) if size else b"").hexdigest()
            st_info = None
            if name.endswith(".safetensors"):
                st_info = _remote_header(fetch, repo, name, size)
            try:
                files.append(LockedFile(path=name, size=size, sha256=sha, safetensors=st_info))
            except ValidationError as exc:
                bad = invalid_document(exc, f"the Hub's metadata for {repo}/{name}")
                raise Unavailable(
                    bad.message, hint="the server is not the Hub, or answered nonsense: check HF_ENDPOINT"
                ) from exc
    return CheckpointLock(
        repo=repo, revision=revision, source="hub", total_size=sum(f.size for f in files), files=files
    )


def hub_headers(token: str | bool | None = None) -> dict[str, str]:
    """The headers huggingface_hub sends itself (auth from HF_TOKEN or the saved token), refused up front when
    the token holds what an HTTP header cannot carry (non-ASCII, a newline) instead of failing mid-request."""
    from huggingface_hub.utils._headers import build_hf_headers

    headers = build_hf_headers(token=token)
    for key, value in headers.items():
        if not value.isascii() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            what = "HF_TOKEN (or the saved Hub token)" if key.lower() == "authorization" else f"the {key} header"
            raise BadInput(
                f"{what} holds characters an HTTP header cannot carry (non-ASCII or control characters)",
                hint="set HF_TOKEN to the token itself, e.g. hf_..., without quotes or spaces",
            )
    return headers


def require_repo_id(repo: str) -> str:
    """A Hub repository id (`owner/name`), checked before it goes into a URL."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise BadInput(
            f"--repo {repo!r} is not a Hub repository id: {exc}",
            hint="pass owner/name, e.g. turboderp/GLM-5.3-Flash-exl3",
        ) from exc
    return repo


def hub_endpoint(endpoint: str | None = None) -> str | None:
    """The argument, else HF_ENDPOINT read now (huggingface_hub itself reads it once, at import); an http(s) URL."""
    from_env = endpoint is None
    value = endpoint or os.environ.get("HF_ENDPOINT") or None
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        where = f"HF_ENDPOINT={value!r}" if from_env else f"endpoint {value!r}"
        raise BadInput(
            f"{where} is not an http(s) URL of a Hub",
            hint="unset it for huggingface.co, or set e.g. https://hf-mirror.com",
        )
    return value.rstrip("/")


def _remote_header(fetch: Any, repo: str, name: str, size: int) -> LockedSafetensors:
    where = Path(f"{repo}/{name}")
    if size < 8:
        raise BadInput(f"{where}: {size} bytes, too short for a safetensors file")
    (header_size,) = struct.unpack("<Q", fetch(name, 0, 8))
    if header_size > MAX_HEADER_SIZE or 8 + header_size > size:
        raise BadInput(f"{where}: invalid safetensors header length {header_size}")
    header = parse_header_bytes(where, fetch(name, 8, 8 + header_size), size)
    return LockedSafetensors(tensors=len(header.tensors), header_sha256=header.header_sha256)


@contextmanager
def hub_errors(repo: str, revision: str) -> Iterator[None]:
    """Turn huggingface_hub's and the network's exceptions into errors that say what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo}@{revision}"
    try:
        yield
    except Glm53Error:
        raise
    except json.JSONDecodeError as exc:  # huggingface_hub parsing an answer that is not JSON (a login page)
        raise Unavailable(
            f"the Hub answered something that is not its API for {where}: {exc}",
            hint="check HF_ENDPOINT and that no proxy or captive portal intercepts the connection",
        ) from exc
    except HFValidationError as exc:
        raise BadInput(f"{where}: {exc}", hint="pass owner/name and a full 40-hex commit") from exc
    except RevisionNotFoundError as exc:
        raise BadInput(
            f"revision {revision} not found in {repo}", hint="check the commit hash (the full 40 hex digits)"
        ) from exc
    except GatedRepoError as exc:
        raise BadInput(f"{repo} is gated", hint="accept its terms and set HF_TOKEN") from exc
    except RepositoryNotFoundError as exc:
        raise BadInput(
            f"repository {repo} not found on the Hub",
            hint="check the name; private repositories need HF_TOKEN",
        ) from exc
    except EntryNotFoundError as exc:
        raise BadInput(f"a file of {where} is missing on the Hub: {exc}") from exc
    except HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code < 500:
            raise BadInput(f"the Hub refused a request for {where}: {exc}") from exc
        raise Unavailable(f"the Hub failed for {where}: {exc}", hint="try again later") from exc
    except Exception as exc:
        if isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore", "h11")):
            raise Unavailable(
                f"cannot reach the Hub for {where}: {exc or type(exc).__name__}",
                hint="check the network, or HF_ENDPOINT",
            ) from exc
        raise


__all__ = [
    "INDEX_BACKUP_NAME",
    "INDEX_NAME",
    "LOCK_FILENAME",
    "CheckpointLock",
    "LockedFile",
    "LockedSafetensors",
    "checkpoint_files",
    "default_lock_path",
    "hub_endpoint",
    "hub_headers",
    "is_tool_file",
    "load_lock",
    "lock_from_directory",
    "lock_from_hub",
    "require_full_revision",
    "require_repo_id",
    "write_lock",
]
