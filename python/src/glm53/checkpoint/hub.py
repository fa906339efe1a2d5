"""Download a checkpoint at a pinned revision, then verify it against its lock.

The lock comes first: the one given, the one already in DIR, or a new one made from the Hub's metadata and
written to DIR/checkpoint.lock.json. Exactly the locked files are then fetched from the Hub's `resolve` URLs
at the pinned commit, each into DIR/.cache/glm53/partial/<path>.part and renamed into place once it has the
locked size. A partial file outlives the run that wrote it (Ctrl-C, a killed process, a network that stays
down past the retries): the next run asks only for the missing bytes with `Range: bytes=N-`. huggingface_hub's
own downloader cannot do that across runs (it writes a per-process temp file and deletes it on failure), so
it serves here only for the HTTP plumbing: auth headers, redirects, retries within a run.

Each file is hashed while it arrives (the kept bytes of an earlier run first) and renamed into place only when
its sha256 is the locked one: nothing under a final name is unverified. A file whose hash is wrong after it was
continued from an earlier run's bytes (the partial held other content) is fetched once more from byte 0; bytes
that still fail are moved to DIR/.cache/glm53/partial/<path>.corrupt, where no loader looks. Then every byte is
verified once more against the lock.

Every path written (the lock, partial files, their folders, the files) must stay inside DIR: a symlink on the
way that leads elsewhere is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, Protocol, cast

from pydantic import BaseModel

from glm53.checkpoint.hashing import HashProgress
from glm53.checkpoint.hub_api import hub_endpoint, hub_errors, hub_headers, lock_from_hub, require_repo_id
from glm53.checkpoint.lock import (
    CheckpointLock,
    LockedFile,
    default_lock_path,
    load_lock,
    require_full_revision,
    write_lock,
)
from glm53.checkpoint.verify import VerifyReport, verify_checkpoint
from glm53.errors import BadInput, CheckFailed, Unavailable

PARTIAL_DIR = Path(".cache") / "glm53" / "partial"


class DownloadProgress(Protocol):
    """Receives the bytes of the whole download from the download threads; must be thread-safe."""

    def start(self, total_bytes: int, files: int, done: int = 0) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class DownloadResult(BaseModel):
    repo: str
    revision: str
    model_dir: str
    lock: str
    lock_created: bool
    files: int
    bytes: int
    files_fetched: int
    bytes_fetched: int
    bytes_resumed: int
    refetched: list[str]
    quarantined: dict[str, str] = {}  # locked path -> where the bytes that failed their sha256 were moved
    verify: VerifyReport


def partial_path(model_dir: Path, relative: str) -> Path:
    """Where the bytes of a locked file wait until it is complete."""
    return Path(model_dir) / PARTIAL_DIR / f"{relative}.part"


def quarantine_path(model_dir: Path, relative: str) -> Path:
    """Where bytes that failed their sha256 are moved: beside the partial files, where no loader looks."""
    return Path(model_dir) / PARTIAL_DIR / f"{relative}.corrupt"


def confined(model_dir: Path, relative: str | PurePath) -> Path:
    """`model_dir / relative`, refused (BadInput naming the path and the link) when a symlink on the way, the
    last component included, leads outside `model_dir`: a download writes inside its directory only."""
    root = Path(model_dir)
    root_real = root.resolve()
    current = root
    for part in PurePosixPath(relative).parts:
        current = current / part
        if current.is_symlink():
            real = current.resolve()
            if real != root_real and root_real not in real.parents:
                raise BadInput(
                    f"{root / relative} would be written through the symlink {current} -> {os.readlink(current)}, "
                    f"which leads outside {root}",
                    fix="remove the link (or replace it with a real directory), then run the same command again",
                )
    return root / relative


def _local_error(path: Path, exc: OSError, model_dir: Path) -> BadInput:
    """A failure of this machine's file system while downloading: the directory, never the network."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        return BadInput(
            f"no space left on device while writing {path}",
            fix="free space, then run the same command again: the bytes written so far are kept",
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return BadInput(
            f"cannot write {path}: {reason}",
            fix=f"make --model-dir {model_dir} writable, or pass a writable one",
        )
    if exc.errno == errno.ELOOP:
        return BadInput(f"cannot write {path}: it is a symlink", fix="remove the link, then run again")
    return BadInput(f"cannot write {path}: {reason}", fix=f"check --model-dir {model_dir}")


def _require_writable(model_dir: Path, why: str) -> None:
    if not os.access(model_dir, os.W_OK | os.X_OK):
        raise BadInput(
            f"--model-dir {model_dir} is not writable ({why})",
            fix="make it writable (not a read-only mount), or pass another --model-dir",
        )


def _confine_all(model_dir: Path, lock: CheckpointLock) -> None:
    """Every path the download of `lock` may write, checked before the first byte is written."""
    for f in lock.files:
        confined(model_dir, f.path)
        confined(model_dir, PARTIAL_DIR / f"{f.path}.part")
        confined(model_dir, PARTIAL_DIR / f"{f.path}.corrupt")


def resolve_lock(
    repo: str, revision: str, model_dir: Path, lock_path: Path | None, *, endpoint: str | None = None
) -> tuple[CheckpointLock, Path, bool]:
    """The lock to download against, and whether it was made now."""
    path = lock_path or default_lock_path(model_dir)
    if lock_path is None:
        path = confined(model_dir, path.name)
    if path.exists():
        lock = load_lock(path)
        if (lock.repo, lock.revision) != (repo, revision):
            raise BadInput(
                f"lock {path} pins {lock.repo}@{lock.revision}, not {repo}@{revision}",
                fix="pass the matching REPO and --revision, or another --checkpoint-lock",
            )
        return lock, path, False
    if lock_path is not None:
        raise BadInput(f"checkpoint lock not found: {lock_path}")
    lock = lock_from_hub(repo, revision, endpoint=endpoint)
    _confine_all(model_dir, lock)  # before the lock, the first thing written
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _local_error(model_dir, exc, model_dir) from exc
    _require_writable(model_dir, f"the lock {path.name} is written there")
    write_lock(lock, path)
    return lock, path, True


class _Stopped(Exception):
    """Raised inside a download thread when the run is being abandoned."""


class _PartFile(io.FileIO):
    """The partial file, opened without truncating it (nor through a symlink) and written unbuffered (every byte
    written is in the file even if the process is killed), reporting each write (and a truncation, when a server
    ignored the Range), hashing what it holds as it grows, and refusing to go on once the run is stopped."""

    def __init__(self, path: Path, on_bytes: Callable[[int], None], stop: threading.Event, model_dir: Path) -> None:
        flags = os.O_CREAT | os.O_NOFOLLOW
        super().__init__(path, "r+", opener=lambda name, mode: os.open(name, mode | flags, 0o644))
        self.seek(0, io.SEEK_END)
        self._on_bytes = on_bytes
        self._stop = stop
        self._model_dir = model_dir
        self._digest = hashlib.sha256()
        self._hashed = 0  # the digest covers the file's bytes [0, _hashed)

    def _hash_up_to(self, end: int) -> None:
        """Bring the digest to the bytes [0, end): the kept bytes of an earlier run, or after a rewind."""
        if end < self._hashed:
            self._digest, self._hashed = hashlib.sha256(), 0
        while self._hashed < end:
            chunk = os.pread(self.fileno(), min(end - self._hashed, 16 * 1024 * 1024), self._hashed)
            if not chunk:
                break
            self._digest.update(chunk)
            self._hashed += len(chunk)

    def write(self, data: Any) -> int:
        if self._stop.is_set():
            raise _Stopped
        view = memoryview(data).cast("B")
        written = 0
        try:
            self._hash_up_to(self.tell())
            while written < len(view):
                n = super().write(view[written:])
                if not n:
                    raise OSError(errno.EIO, "short write")
                written += n
        except OSError as exc:  # the disk, not the network: say so (ENOSPC, EROFS, EIO)
            raise _local_error(Path(str(self.name)), exc, self._model_dir) from exc
        self._digest.update(view[:written])
        self._hashed += written
        self._on_bytes(written)
        return written

    def truncate(self, size: int | None = None) -> int:
        before = os.fstat(self.fileno()).st_size
        after = super().truncate(size)  # at the current position when size is None; the position stays
        self._on_bytes(after - before)
        return after

    def sha256(self) -> str:
        """SHA-256 of the whole file as it is now."""
        self._hash_up_to(os.fstat(self.fileno()).st_size)
        return self._digest.hexdigest()


@dataclass
class _Job:
    file: LockedFile
    part: Path
    kept: int


class _Fetcher:
    def __init__(
        self,
        repo: str,
        revision: str,
        model_dir: Path,
        endpoint: str | None,
        progress: DownloadProgress | None,
        max_workers: int,
    ) -> None:
        self.repo, self.revision, self.model_dir, self.endpoint = repo, revision, model_dir, endpoint
        self.progress = progress
        self.max_workers = max(1, max_workers)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.mismatched: dict[str, str] = {}  # path -> sha256 of the bytes received, left in the partial file

    def plan(self, files: Iterable[LockedFile], *, fresh: bool) -> list[_Job]:
        jobs = []
        for f in files:
            part = confined(self.model_dir, PARTIAL_DIR / f"{f.path}.part")
            try:
                if fresh:
                    part.unlink(missing_ok=True)
                kept = part.stat().st_size if part.is_file() else 0
                if kept > f.size:  # longer than the locked file: not a prefix of it
                    part.unlink()
                    kept = 0
            except OSError as exc:
                raise _local_error(part, exc, self.model_dir) from exc
            jobs.append(_Job(f, part, kept))
        return jobs

    def run(self, jobs: list[_Job]) -> None:
        """Fetch every job, a few at a time, in daemon threads: on Ctrl-C the main thread stops them and
        leaves at once (a thread blocked on the network cannot hold the process), the bytes written kept."""
        if not jobs:
            return
        if self.progress is not None:
            self.progress.start(sum(j.file.size for j in jobs), len(jobs), done=sum(j.kept for j in jobs))
        todo: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        for job in sorted(jobs, key=lambda j: j.file.size - j.kept, reverse=True):
            todo.put(job)
        done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

        def worker() -> None:
            while not self.stop.is_set():
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    break
                try:
                    self._fetch(job)
                except BaseException as exc:  # handed to the main thread, which raises it
                    self.stop.set()
                    done.put(exc)
                    return
            done.put(None)

        threads = [
            threading.Thread(target=worker, name=f"glm53-download-{i}", daemon=True)
            for i in range(min(self.max_workers, len(jobs)))
        ]
        for thread in threads:
            thread.start()
        finished: list[BaseException | None] = []
        try:
            while len(finished) < len(threads):
                # A short timeout, not a blocking get(): the main thread comes back to Python between waits, so
                # Ctrl-C is handled at once on every Python (a blocked lock wait is not interrupted everywhere).
                with contextlib.suppress(queue.Empty):
                    finished.append(done.get(timeout=0.2))
        except BaseException:
            self.stop.set()
            raise
        failures = [e for e in finished if e is not None]
        if failures:
            raise next((e for e in failures if not isinstance(e, _Stopped)), failures[0])

    def _advance(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_fetched += nbytes
        if self.progress is not None:
            self.progress.advance(nbytes)

    def _fetch(self, job: _Job) -> None:
        # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils.tqdm import silent_tqdm

        f = job.file
        url = hf_hub_url(self.repo, f.path, revision=self.revision, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, endpoint=self.endpoint, retry_on_errors=True)
        if meta.commit_hash is None and meta.etag is None:  # a login page or a proxy's answer, not a Hub file
            raise Unavailable(
                f"{url} answered without the Hub's headers (no X-Repo-Commit, no ETag): not the Hub's API",
                fix=f"check HF_ENDPOINT (now {self.endpoint or 'unset: https://huggingface.co'}) and that no "
                "proxy or captive portal intercepts the connection",
            )
        if meta.commit_hash is not None and meta.commit_hash != self.revision:
            raise CheckFailed(f"the Hub answered {f.path} from commit {meta.commit_hash}, not {self.revision}")
        if meta.size is not None and meta.size != f.size:
            raise CheckFailed(
                f"the Hub serves {meta.size:,} bytes for {f.path} at {self.revision}; the lock says {f.size:,}",
                fix="check that the lock belongs to this repository and revision",
            )
        try:
            job.part.parent.mkdir(parents=True, exist_ok=True)
            handle = _PartFile(job.part, self._advance, self.stop, self.model_dir)
        except OSError as exc:
            raise _local_error(job.part, exc, self.model_dir) from exc
        headers = hub_headers()
        headers["Accept-Encoding"] = "identity"  # byte offsets must be those of the file, not of a gzip stream
        with handle:
            try:  # two runs appending to one partial file would interleave their bytes
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BadInput(
                    f"another download is writing {job.part}", fix="wait for it to finish, or stop it"
                ) from None
            kept = handle.tell()
            http_get(
                url,
                cast(Any, handle),
                resume_size=kept,
                headers=headers,
                expected_size=f.size,
                displayed_filename=f.path,
                tqdm_class=cast(Any, silent_tqdm),
            )
            try:
                digest = handle.sha256()
                os.fsync(handle.fileno())
            except OSError as exc:
                raise _local_error(job.part, exc, self.model_dir) from exc
        if digest != f.sha256:  # not the locked file: it stays out of its final name
            with self._lock:
                self.mismatched[f.path] = digest
            return
        target = confined(self.model_dir, f.path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            job.part.replace(target)
        except OSError as exc:
            raise _local_error(target, exc, self.model_dir) from exc


def download_checkpoint(
    repo: str,
    revision: str,
    model_dir: Path,
    *,
    lock_path: Path | None = None,
    endpoint: str | None = None,
    jobs: int | None = None,
    max_workers: int = 4,
    progress: DownloadProgress | None = None,
    verify_progress: HashProgress | None = None,
) -> DownloadResult:
    """Fetch the locked files missing from `model_dir` (a file already there with the locked size is kept and
    left to the verify), continuing any partial file, then verify everything against the lock."""
    require_full_revision(revision)
    require_repo_id(repo)
    endpoint = hub_endpoint(endpoint)
    hub_headers()  # a token no HTTP header can carry is refused before anything is asked or written
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise BadInput(f"--model-dir {model_dir} exists and is not a directory")
    lock, path, created = resolve_lock(repo, revision, model_dir, lock_path, endpoint=endpoint)
    _confine_all(model_dir, lock)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _local_error(model_dir, exc, model_dir) from exc
    fetcher = _Fetcher(repo, revision, model_dir, endpoint, progress, max_workers)

    def present(f: LockedFile) -> bool:
        target = model_dir / f.path
        return target.is_file() and target.stat().st_size == f.size

    wanted = [f for f in lock.files if not present(f)]
    if wanted:
        _require_writable(model_dir, f"{len(wanted)} locked files are to be downloaded into it")
    planned = fetcher.plan(wanted, fresh=False)
    with hub_errors(repo, revision):
        fetcher.run(planned)
    # Bytes kept from an earlier run that were not the locked file's: fetch those files whole, once.
    retry = [j.file for j in planned if j.kept > 0 and j.file.path in fetcher.mismatched]
    if retry:
        for f in retry:
            del fetcher.mismatched[f.path]
        with hub_errors(repo, revision):
            fetcher.run(fetcher.plan(retry, fresh=True))
    quarantined: dict[str, str] = {}
    for relative in sorted(fetcher.mismatched):
        where = quarantine_path(model_dir, relative)
        try:
            partial_path(model_dir, relative).replace(where)
        except OSError as exc:
            raise _local_error(where, exc, model_dir) from exc
        quarantined[relative] = str(where)
    report = verify_checkpoint(model_dir, path, jobs=jobs, progress=verify_progress)

    result = DownloadResult(
        repo=repo,
        revision=revision,
        model_dir=str(model_dir),
        lock=str(path),
        lock_created=created,
        files=len(lock.files),
        bytes=lock.total_size,
        files_fetched=len(planned),
        bytes_fetched=fetcher.bytes_fetched,
        bytes_resumed=sum(j.kept for j in planned),
        refetched=sorted(f.path for f in retry),
        quarantined=quarantined,
        verify=report,
    )
    if quarantined or not report.ok:
        problems = [
            f"hash mismatch: {rel} (the bytes the Hub served were moved to {where}; nothing is under {rel})"
            for rel, where in quarantined.items()
        ]
        rest = report.model_copy(update={"missing": [m for m in report.missing if m not in quarantined]})
        if not report.ok and rest.summary:
            problems.append(rest.summary)
        raise CheckFailed(
            f"downloaded files do not match the lock {path}: {'; '.join(problems)}",
            fix="run download again; if the same files fail, the Hub serves other bytes than the lock pins: "
            "check the lock's repository and revision",
        )
    return result


__all__ = ["DownloadProgress", "DownloadResult", "download_checkpoint", "partial_path", "resolve_lock"]
