"""The checkpoint lock: every file of a checkpoint by relative path, with its size and SHA-256, and for
safetensors files the tensor count and the SHA-256 of the JSON header.

A lock is made from a local directory (hashing every file) or from the Hub's file metadata at a pinned
revision (`glm53.checkpoint.hub_api.lock_from_hub`, which downloads no weights). It lives by default at
DIR/checkpoint.lock.json; the lock file itself, huggingface_hub's `.cache/` folder and the index backup made by
`glm53 model install` are not part of the checkpoint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from glm53.checkpoint.hashing import HashProgress, hash_with_cache
from glm53.checkpoint.safetensors_header import read_safetensors_header
from glm53.errors import BadInput, Glm53Error, invalid_document
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
            fix="pin the commit, e.g. --revision 332ab457b709b7ba30dd9a448be5de03b80a7ac9",
        )
    return revision


def load_lock(path: Path) -> CheckpointLock:
    raw = read_json(path, what="checkpoint lock")
    try:
        return CheckpointLock.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"checkpoint lock {path}", fix="regenerate it with `glm53 model lock`") from exc


def write_lock(lock: CheckpointLock, path: Path, *, force: bool = False) -> None:
    if path.exists() and not force:
        raise BadInput(f"{path} already exists", fix="pass --force to replace it")
    atomic_write_json(path, lock.model_dump(mode="json"), overwrite=force)


class WrittenLock(CheckpointLock):
    """`glm53 model lock`'s result: the lock, and where it was written."""

    lock: str


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
                fix="make it readable, or move it out of the model directory",
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
                            fix="replace the link with the directory itself, or move the link out",
                        )
                    if real in ancestors:
                        raise BadInput(
                            f"model directory: {rel} is a symlink to {os.readlink(entry.path)}, "
                            "which loops back to a directory containing it",
                            fix="remove the link",
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
            fix="wait for writers to finish, then lock again",
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
            raise Glm53Error(f"{path} vanished while being locked", fix="wait for writers to finish") from exc
        files.append(LockedFile(path=rel, size=size, sha256=outcome.sha256[path], safetensors=st_info))
    return CheckpointLock(
        repo=repo, revision=revision, source="local", total_size=sum(f.size for f in files), files=files
    )


__all__ = [
    "INDEX_BACKUP_NAME",
    "INDEX_NAME",
    "LOCK_FILENAME",
    "CheckpointLock",
    "LockedFile",
    "LockedSafetensors",
    "WrittenLock",
    "checkpoint_files",
    "default_lock_path",
    "is_tool_file",
    "load_lock",
    "lock_from_directory",
    "require_full_revision",
    "write_lock",
]
