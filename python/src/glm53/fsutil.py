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
from glm53.safetext import quoted

# Linux's limits: a name in a directory (NAME_MAX) and a whole path (PATH_MAX), in bytes.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096

# The one output policy of every --out / -o (docs/cli.md's header and each such option's --help state it).
OUTPUT_POLICY = (
    "Outputs are written atomically through a symlink to its target; a directory, FIFO, device or socket where "
    "a file goes is refused."
)


def path_problem(path: os.PathLike[str] | str) -> str | None:
    """Why `path` cannot name a file on Linux (too long, a NUL byte), or None."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        return "holds a NUL byte"
    if len(raw) > MAX_PATH_BYTES:
        return f"is {len(raw):,} bytes long, more than the {MAX_PATH_BYTES:,} a path may be"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > MAX_NAME_BYTES:
        return f"has a name of {len(longest):,} bytes, more than the {MAX_NAME_BYTES} a file name may be"
    return None


def check_path(path: os.PathLike[str] | str, *, what: str) -> None:
    """BadInput (exit 2) naming `what` when `path` is too long or holds a NUL byte."""
    problem = path_problem(path)
    if problem is not None:
        raise BadInput(f"{what}: the path {quoted(os.fsdecode(path), limit=120)} {problem}", fix="give a shorter path")


_KIND_NAMES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def output_target(path: Path) -> Path:
    """Where writing `path` goes under the output policy: itself, or the file its symlinks lead to. BadInput
    when that is a directory, FIFO, device or socket: the atomic rename would replace it (as root, `--out
    /dev/stdout` would turn /dev/stdout into a regular file), so it is refused."""
    path = Path(path)
    check_path(path, what="output")
    try:
        info = os.stat(path)  # follows symlinks, /proc's magic links too (/dev/stdout -> a pipe or a tty)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise _write_error(path, exc) from exc
    if info is not None:
        for test, kind in _KIND_NAMES:
            if test(info.st_mode):
                raise BadInput(
                    f"{path} is {kind}: an output is written to a regular file only",
                    fix="give a file path (without the option, commands that print write to stdout)",
                )
    if not os.path.islink(path):
        return path
    target = Path(os.path.realpath(path))
    if info is None and not target.parent.is_dir():
        raise BadInput(f"{path} is a symlink to {target}, in a directory that does not exist")
    return target


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool = True, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temp file in the same directory, fsync, then rename.

    A reader sees the old file or the new one, never half of one; on any failure (ENOSPC, EROFS, a signal)
    the temp file is removed and the original is untouched. The output policy (`output_target`): a symlink
    is written through, to its target; a directory, FIFO, device or socket is refused.
    """
    path = output_target(Path(path))
    if not overwrite and path.exists():
        raise BadInput(f"{path} already exists", fix="pass --force to replace it")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=directory)
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
    except BaseException as exc:  # a signal (glm53.proc.Terminated) or Ctrl-C too: no temp file is left
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise _write_error(path, exc) from exc
        raise


# What a newcomer does about a checkpoint directory that is not there (doctor, serve, plan say it).
GET_THE_CHECKPOINT = (
    "download and lock the checkpoint first (glm53 model download ..., docs/checkpoint.md), or give the "
    "directory that holds it"
)


def missing_directory(path: Path) -> str | None:
    """Why `path` cannot be read as a directory ("does not exist", "is not a directory", "... too long"), or None."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    if path.is_dir():
        return None
    if not path.exists():
        return "does not exist"
    return "is not a directory"


def missing_file(path: Path) -> str | None:
    """Why `path` cannot be read as a regular file ("does not exist", "is a directory", ...), or None."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(info.st_mode):
        return None
    return next((f"is {kind}" for test, kind in _KIND_NAMES if test(info.st_mode)), "is not a regular file")


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
        return BadInput(f"no space left on device while writing {path}", fix="free space and run again")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return BadInput(f"cannot write {path}: {exc.strerror}", fix="check that the directory is writable")
    if exc.errno == errno.EEXIST:
        return BadInput(f"{path} already exists", fix="pass --force to replace it")
    return BadInput(f"cannot write {path}: {exc}")


# Files a person hands to a command (env files, keys, plans, locks) are small; anything bigger is a mistake
# such as /dev/zero, and is refused before it is read into memory.
MAX_INPUT_BYTES = 64 * 1024 * 1024


# Reads take at most this much at a time: memory follows what a file holds, never the bound.
READ_CHUNK = 1 << 20


def read_bytes_bounded(path: Path, *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. A FIFO, a device or a directory is refused before
    anything is read (a FIFO would block forever, /dev/zero would fill memory). Read in chunks of at most
    READ_CHUNK: a 4 KiB file costs 4 KiB however large the bound (a 1 GiB bound is not reserved)."""
    path = Path(path)
    check_path(path, what=what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise BadInput(f"{what}: {path} not found") from exc
    except OSError as exc:
        raise BadInput(f"{what}: cannot read {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{what}: {path} is not a regular file", fix="pass the file itself, not a pipe or device")
        if info.st_size > max_bytes:
            raise BadInput(f"{what}: {path} is {info.st_size:,} bytes, more than the {max_bytes:,} this takes")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes and (chunk := os.read(fd, min(READ_CHUNK, max_bytes + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
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


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are distinct: with a key twice, which value counts depends on the reader."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


def parse_json(raw: str | bytes, *, what: str, fix: str | None = None) -> Any:
    """JSON from any source (a file, a server, a value), every failure a BadInput that names it: bad syntax,
    bad UTF-8, nesting deeper than Python's recursion allows, integers longer than Python converts (4300
    digits), a key twice in one object."""
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise BadInput(f"{what}: the key {quoted(str(exc), limit=80)} appears twice in one object", fix=fix) from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}", fix=fix) from exc
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} is not UTF-8 JSON (byte {exc.start})", fix=fix) from exc
    except RecursionError as exc:
        raise BadInput(f"{what}: JSON nested too deeply to read", fix=fix) from exc
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        if "digits" in str(exc):
            raise BadInput(f"{what}: a number of more than 4300 digits (the longest read)", fix=fix) from exc
        raise BadInput(f"{what}: {exc}", fix=fix) from exc


def read_json(path: Path, *, what: str, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """Read a JSON file, turning every failure into a BadInput that names the file."""
    raw = read_bytes_bounded(path, what=what, max_bytes=max_bytes)
    return parse_json(raw, what=f"{what} {path}", fix="restore or regenerate the file")


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
            fix="replace the symlink with the file itself",
        )
    return candidate
