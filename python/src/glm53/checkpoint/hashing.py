"""SHA-256 of many large files at the speed of all cores, and a stat cache that skips unchanged files.

Hashing: one thread per core, each file read with large `readinto` calls into a reused buffer. Both the read
and `hashlib.sha256.update` on a large buffer release the GIL, so threads hash files truly in parallel and
there is no per-byte Python work. Files are hashed whole (SHA-256 cannot be split), biggest first.

Stat cache: `$XDG_CACHE_HOME/glm53/sha256-stat-cache.json` (default ~/.cache/glm53/), outside the model
directory, which may be read-only. An entry is trusted only when (device, inode, size, mtime_ns, ctime_ns)
all match. ctime cannot be set by users: a file whose content changed and whose mtime was put back still
gets a new ctime and is hashed again. An entry recorded while the file was younger than the timestamp
granularity window is not trusted either (a write in the same clock tick would not move the stamps).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from glm53.errors import BadInput
from glm53.fsutil import atomic_write_json, read_json

READ_CHUNK = 16 * 1024 * 1024
CACHE_VERSION = 1
# Stamps closer than this to the moment of hashing are not trusted (coarse clocks; 2 s on some filesystems).
RACY_WINDOW_NS = 2_000_000_000
MAX_CACHE_ENTRIES = 100_000


class HashProgress(Protocol):
    """Receives progress from the hashing threads; implementations must be thread-safe."""

    def start(self, total_bytes: int, files: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class FileStamp:
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def sha256_file(
    path: Path,
    *,
    buffer: bytearray | None = None,
    on_bytes: Callable[[int], None] | None = None,
    limit: int | None = None,
) -> str:
    """SHA-256 of one file with large reads into `buffer` (allocated when not given).

    `limit` stops after that many bytes, so a file that keeps growing cannot keep the reader busy.
    """
    buf = buffer if buffer is not None else bytearray(READ_CHUNK)
    view = memoryview(buf)
    digest = hashlib.sha256()
    remaining = -1 if limit is None else limit
    # O_NONBLOCK: a FIFO put in a file's place must not block the reader forever; anything but a regular
    # file is refused before a byte is read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb", buffering=0) as handle:
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while remaining:
            n = handle.readinto(view if remaining < 0 or remaining >= len(view) else view[:remaining])
            if not n:
                break
            remaining -= n if remaining > 0 else 0
            digest.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return digest.hexdigest()


class NotARegularFile(OSError):
    """A path listed as a file is now a directory, a FIFO, a device or a socket."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} is not a regular file")
        self.filename = str(path)


def hash_files(
    paths: Iterable[Path],
    *,
    jobs: int | None = None,
    progress: HashProgress | None = None,
    unreadable: list[Path] | None = None,
) -> dict[Path, str]:
    """SHA-256 of every file, `jobs` files at a time (default: the CPUs this process may use).

    With `unreadable` given, a file that vanished, became a directory or a FIFO, or cannot be read is appended
    there and left out of the answer instead of raising (a verify must report it, not crash).
    """
    sized: list[tuple[Path, int]] = []
    for p in paths:
        try:
            sized.append((p, os.stat(p).st_size))
        except OSError:
            if unreadable is None:
                raise
            unreadable.append(p)
    sized.sort(key=lambda item: -item[1])
    if progress is not None:
        progress.start(sum(size for _, size in sized), len(sized))
    workers = max(1, min(jobs or default_jobs(), len(sized) or 1))
    local = threading.local()

    def work(item: tuple[Path, int]) -> tuple[Path, str | None]:
        path, size = item
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = bytearray(READ_CHUNK)
        on_bytes = progress.advance if progress else None
        # Read what the file held when listed; a file that grows meanwhile shows up in its stamps.
        try:
            return path, sha256_file(path, buffer=buffer, on_bytes=on_bytes, limit=size)
        except OSError:
            if unreadable is None:
                raise
            return path, None

    if workers == 1:
        results = [work(item) for item in sized]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sha256") as pool:
            results = list(pool.map(work, sized))
    if unreadable is not None:
        unreadable.extend(path for path, digest in results if digest is None)
    return {path: digest for path, digest in results if digest is not None}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "glm53"


class StatCache:
    """(device, inode) -> stamp + sha256, persisted as one JSON file written atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "sha256-stat-cache.json"
        self._entries: dict[str, dict[str, int | str]] = {}
        self._dirty = False
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:  # bounded, refuses a FIFO or a device, and turns every JSON defect (nesting, huge integers) into
            raw = read_json(self.path, what="sha256 stat cache")  # BadInput
        except (OSError, BadInput):
            return  # an unreadable or corrupt cache is only a cache: ignore it, hash afresh
        if isinstance(raw, dict) and raw.get("version") == CACHE_VERSION and isinstance(raw.get("entries"), dict):
            self._entries = {k: v for k, v in raw["entries"].items() if _valid_entry(v)}

    @staticmethod
    def _key(stamp: FileStamp) -> str:
        return f"{stamp.device}:{stamp.inode}"

    def lookup(self, stamp: FileStamp) -> str | None:
        entry = self._entries.get(self._key(stamp))
        if entry is None:
            return None
        if (entry["size"], entry["mtime_ns"], entry["ctime_ns"]) != (
            stamp.size,
            stamp.mtime_ns,
            stamp.ctime_ns,
        ):
            return None
        recorded = int(entry["recorded_ns"])
        if max(stamp.mtime_ns, stamp.ctime_ns) + RACY_WINDOW_NS > recorded:
            return None
        return str(entry["sha256"])

    def store(self, stamp: FileStamp, sha256: str, *, recorded_ns: int) -> None:
        self._entries[self._key(stamp)] = {
            "size": stamp.size,
            "mtime_ns": stamp.mtime_ns,
            "ctime_ns": stamp.ctime_ns,
            "sha256": sha256,
            "recorded_ns": recorded_ns,
        }
        self._dirty = True

    def save(self) -> None:
        """Merge with what another run may have written meanwhile, then write atomically; never fatal."""
        if not self._dirty:
            return
        merged = StatCache(self.path)._entries
        merged.update(self._entries)
        if len(merged) > MAX_CACHE_ENTRIES:
            newest = sorted(merged.items(), key=lambda kv: int(kv[1]["recorded_ns"]))[-MAX_CACHE_ENTRIES:]
            merged = dict(newest)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, {"version": CACHE_VERSION, "entries": merged})
        except (OSError, BadInput):
            return  # a cache that cannot be written only costs time next run
        self._dirty = False


def _valid_entry(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    ints = all(isinstance(value.get(k), int) for k in ("size", "mtime_ns", "ctime_ns", "recorded_ns"))
    sha = value.get("sha256")
    return ints and isinstance(sha, str) and len(sha) == 64


@dataclass
class HashOutcome:
    sha256: dict[Path, str]
    bytes_hashed: int
    bytes_cached: int
    changed_while_hashing: list[Path]
    # Vanished, replaced by a directory/FIFO, or unreadable while being hashed: no digest in `sha256`.
    vanished: list[Path] = field(default_factory=list)


def hash_with_cache(
    paths: list[Path],
    *,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: HashProgress | None = None,
    cache: StatCache | None = None,
) -> HashOutcome:
    """Hash `paths`, answering unchanged files from the stat cache and recording fresh hashes in it."""
    cache = (cache or StatCache()) if use_cache else None
    vanished: list[Path] = []
    stamps: dict[Path, FileStamp] = {}
    for p in paths:
        stamp = _stamp(p)
        if stamp is None:
            vanished.append(p)
        else:
            stamps[p] = stamp
    known: dict[Path, str] = {}
    todo: list[Path] = []
    for path, stamp in stamps.items():
        cached = cache.lookup(stamp) if cache is not None else None
        if cached is None:
            todo.append(path)
        else:
            known[path] = cached
    recorded_ns = time.time_ns()
    fresh = hash_files(todo, jobs=jobs, progress=progress, unreadable=vanished)
    changed: list[Path] = []
    for path, digest in list(fresh.items()):
        after = _stamp(path)
        if after is None:  # gone (or no longer a regular file) once read: no digest describes it
            del fresh[path]
            vanished.append(path)
            continue
        if after != stamps[path]:
            changed.append(path)  # written to while being read: the digest describes no single state
            continue
        if cache is not None:
            cache.store(after, digest, recorded_ns=recorded_ns)
    if cache is not None:
        cache.save()
    return HashOutcome(
        sha256={**known, **fresh},
        bytes_hashed=sum(stamps[p].size for p in todo),
        bytes_cached=sum(stamps[p].size for p in known),
        changed_while_hashing=changed,
        vanished=vanished,
    )


def _stamp(path: Path) -> FileStamp | None:
    """The stamp of a regular file, None when it is gone or is something else now (a directory, a FIFO)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp.of(st) if stat.S_ISREG(st.st_mode) else None


__all__ = [
    "FileStamp",
    "HashOutcome",
    "HashProgress",
    "NotARegularFile",
    "StatCache",
    "cache_dir",
    "default_jobs",
    "hash_files",
    "hash_with_cache",
    "sha256_file",
]
