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
import os
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from glm53.checkpoint.hashing import HashProgress, hash_with_cache
from glm53.checkpoint.safetensors_header import MAX_HEADER_SIZE, parse_header_bytes, read_safetensors_header
from glm53.errors import BadInput, Glm53Error, Unavailable, invalid_document
from glm53.fsutil import atomic_write_json, read_json, resolve_inside, safe_relative_path

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
    """Relative paths of the checkpoint's files (sorted), refusing symlinks that leave the directory."""
    root = Path(model_dir)
    if not root.is_dir():
        raise BadInput(f"model directory not found: {root}")
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == Path(".") and d in IGNORED_FOLDERS))
        for name in filenames:
            relative = (rel_dir / name).as_posix()
            if is_tool_file(relative) or _is_temp_file(name):
                continue
            full = resolve_inside(root, PurePosixPath(relative), what="model directory")
            if full.is_file():
                found.append(relative)
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
    if outcome.changed_while_hashing:
        changed = ", ".join(str(p) for p in outcome.changed_while_hashing)
        raise Glm53Error(f"files changed while being hashed: {changed}", hint="wait for writers to finish")
    files = []
    for rel, path in paths.items():
        st_info = None
        if rel.endswith(".safetensors"):
            header = read_safetensors_header(path)
            st_info = LockedSafetensors(tensors=len(header.tensors), header_sha256=header.header_sha256)
        files.append(LockedFile(path=rel, size=path.stat().st_size, sha256=outcome.sha256[path], safetensors=st_info))
    return CheckpointLock(
        repo=repo, revision=revision, source="local", total_size=sum(f.size for f in files), files=files
    )


def lock_from_hub(
    repo: str, revision: str, *, endpoint: str | None = None, token: str | bool | None = None
) -> CheckpointLock:
    """A lock from the Hub's metadata at `revision`, reading only headers and small files."""
    from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status

    require_full_revision(revision)
    endpoint = hub_endpoint(endpoint)
    api = HfApi(endpoint=endpoint, token=token)
    with hub_errors(repo, revision):
        info = api.model_info(repo, revision=revision, files_metadata=True)
        if info.sha != revision:
            raise BadInput(f"the Hub answered revision {info.sha} for {repo}@{revision}")
        session = get_session()
        headers = api._build_hf_headers(token=token)  # the auth headers huggingface_hub sends itself

        def fetch(filename: str, start: int, end: int) -> bytes:
            url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
            response = session.get(url, headers={**headers, "Range": f"bytes={start}-{end - 1}"}, follow_redirects=True)
            hf_raise_for_status(response)
            data: bytes = response.content
            if response.status_code == 200:  # server ignored the range
                data = data[start:end]
            if len(data) != end - start:
                raise Glm53Error(f"{repo}/{filename}: asked bytes {start}-{end - 1}, got {len(data)} bytes")
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
            files.append(LockedFile(path=name, size=size, sha256=sha, safetensors=st_info))
    return CheckpointLock(
        repo=repo, revision=revision, source="hub", total_size=sum(f.size for f in files), files=files
    )


def hub_endpoint(endpoint: str | None = None) -> str | None:
    """The argument, else HF_ENDPOINT read now (huggingface_hub itself reads it once, at import)."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None


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
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo}@{revision}"
    try:
        yield
    except Glm53Error:
        raise
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
        if isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore")):
            raise Unavailable(
                f"cannot reach the Hub for {where}: {exc}", hint="check the network, or HF_ENDPOINT"
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
    "is_tool_file",
    "load_lock",
    "lock_from_directory",
    "lock_from_hub",
    "require_full_revision",
    "write_lock",
]
