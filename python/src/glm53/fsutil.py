"""File-system helpers shared by every writer: atomic writes and paths confined to a directory."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from glm53.errors import BadInput


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool = True, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temp file in the same directory, fsync, then rename.

    A reader sees the old file or the new one, never half of one; on any failure (ENOSPC, EROFS)
    the temp file is removed and the original is untouched.
    """
    path = Path(path)
    if not overwrite and path.exists():
        raise BadInput(f"{path} already exists", hint="pass --force to replace it")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _write_error(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        if not overwrite:
            # link() fails if the target appeared meanwhile: no silent overwrite race.
            os.link(tmp_name, path)
            os.unlink(tmp_name)
        else:
            os.replace(tmp_name, path)
        _fsync_dir(directory)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise _write_error(path, exc) from exc


# What a newcomer does about a checkpoint directory that is not there (doctor, serve, plan say it).
GET_THE_CHECKPOINT = (
    "download and lock the checkpoint first (glm53 model download ..., docs/checkpoint.md), or give the "
    "directory that holds it"
)


def missing_directory(path: Path) -> str | None:
    """Why `path` cannot be read as a directory ("does not exist", "is not a directory"), or None."""
    if path.is_dir():
        return None
    if not path.exists():
        return "does not exist"
    return "is not a directory"


def atomic_write_text(path: Path, text: str, *, overwrite: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def atomic_write_json(path: Path, value: Any, *, overwrite: bool = True) -> None:
    # allow_nan=False: NaN and Infinity are not JSON; a value that holds one is a bug to surface, not to write.
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=False, allow_nan=False) + "\n", overwrite=overwrite)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_error(path: Path, exc: OSError) -> BadInput:
    if exc.errno == errno.ENOSPC:
        return BadInput(f"no space left on device while writing {path}", hint="free space and run again")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return BadInput(f"cannot write {path}: {exc.strerror}", hint="check that the directory is writable")
    if exc.errno == errno.EEXIST:
        return BadInput(f"{path} already exists", hint="pass --force to replace it")
    return BadInput(f"cannot write {path}: {exc}")


# Files a person hands to a command (env files, keys, plans, locks) are small; anything bigger is a mistake
# such as /dev/zero, and is refused before it is read into memory.
MAX_INPUT_BYTES = 64 * 1024 * 1024


def read_bytes_bounded(path: Path, *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. A FIFO, a device or a directory is refused before
    anything is read (a FIFO would block forever, /dev/zero would fill memory)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise BadInput(f"{what}: {path} not found") from exc
    except OSError as exc:
        raise BadInput(f"{what}: cannot read {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{what}: {path} is not a regular file", hint="pass the file itself, not a pipe or device")
        if info.st_size > max_bytes:
            raise BadInput(f"{what}: {path} is {info.st_size:,} bytes, more than the {max_bytes:,} this takes")
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise BadInput(f"{what}: cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise BadInput(f"{what}: {path} grew past {max_bytes:,} bytes while being read")
    return data


def read_text_bounded(path: Path, *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    data = read_bytes_bounded(path, what=what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what}: {path} is not UTF-8 text (byte {exc.start})") from exc


def parse_json(raw: str | bytes, *, what: str, hint: str | None = None) -> Any:
    """JSON from any source (a file, a server, a value), every failure a BadInput that names it: bad syntax,
    bad UTF-8, nesting deeper than Python's recursion allows, integers longer than Python converts."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}", hint=hint) from exc
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} is not UTF-8 JSON (byte {exc.start})", hint=hint) from exc
    except RecursionError as exc:
        raise BadInput(f"{what}: JSON nested too deeply to read", hint=hint) from exc
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise BadInput(f"{what}: {exc}", hint=hint) from exc


def read_json(path: Path, *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """Read a JSON file, turning every failure into a BadInput that names the file."""
    raw = read_bytes_bounded(path, what=what, max_bytes=max_bytes)
    return parse_json(raw, what=f"{what} {path}", hint="restore or regenerate the file")


def safe_relative_path(name: str, *, what: str) -> PurePosixPath:
    """Validate a path taken from a lock or an index: relative, normalised, never leaving its root."""
    if not name or "\x00" in name or "\\" in name:
        raise BadInput(f"{what}: invalid path {name!r}")
    posix = PurePosixPath(name)
    if posix.is_absolute() or any(part in ("..", "") for part in posix.parts) or name != str(posix):
        raise BadInput(f"{what}: path {name!r} must be relative and stay inside the model directory")
    return posix


def resolve_inside(root: Path, relative: PurePosixPath, *, what: str) -> Path:
    """Join `relative` to `root`, refusing symlinks that lead outside `root`."""
    root_real = Path(root).resolve()
    candidate = root_real / relative
    real = candidate.resolve()
    if real != root_real and root_real not in real.parents:
        raise BadInput(
            f"{what}: {relative} resolves to {real}, outside {root_real}",
            hint="replace the symlink with the file itself",
        )
    return candidate
