"""Download a checkpoint at a pinned revision, then verify it against its lock.

The lock comes first: the one given, the one already in DIR, or a new one made from the Hub's metadata and
written to DIR/checkpoint.lock.json. Exactly the locked files are then fetched from the Hub's `resolve` URLs
at the pinned commit, each into DIR/.cache/glm53/partial/<path>.part and renamed into place once it has the
locked size. A partial file outlives the run that wrote it (Ctrl-C, a killed process, a network that stays
down past the retries): the next run asks only for the missing bytes with `Range: bytes=N-`. huggingface_hub's
own downloader cannot do that across runs (it writes a per-process temp file and deletes it on failure), so
it serves here only for the HTTP plumbing: auth headers, redirects, retries within a run.

Then every byte is verified. A file whose hash is wrong after it was continued from an earlier run's bytes
(the partial held other content) is fetched once more from byte 0 and verified again.
"""

from __future__ import annotations

import fcntl
import io
import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from pydantic import BaseModel

from glm53.checkpoint.hashing import HashProgress
from glm53.checkpoint.lock import (
    CheckpointLock,
    LockedFile,
    default_lock_path,
    hub_endpoint,
    hub_errors,
    load_lock,
    lock_from_hub,
    require_full_revision,
    write_lock,
)
from glm53.checkpoint.verify import VerifyReport, verify_checkpoint
from glm53.errors import BadInput, CheckFailed

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
    verify: VerifyReport


def partial_path(model_dir: Path, relative: str) -> Path:
    """Where the bytes of a locked file wait until it is complete."""
    return Path(model_dir) / PARTIAL_DIR / f"{relative}.part"


def resolve_lock(
    repo: str, revision: str, model_dir: Path, lock_path: Path | None, *, endpoint: str | None = None
) -> tuple[CheckpointLock, Path, bool]:
    """The lock to download against, and whether it was made now."""
    path = lock_path or default_lock_path(model_dir)
    if path.exists():
        lock = load_lock(path)
        if (lock.repo, lock.revision) != (repo, revision):
            raise BadInput(
                f"lock {path} pins {lock.repo}@{lock.revision}, not {repo}@{revision}",
                hint="pass the matching --repo/--revision, or another --lock",
            )
        return lock, path, False
    if lock_path is not None:
        raise BadInput(f"checkpoint lock not found: {lock_path}")
    lock = lock_from_hub(repo, revision, endpoint=endpoint)
    model_dir.mkdir(parents=True, exist_ok=True)
    write_lock(lock, path)
    return lock, path, True


class _Stopped(Exception):
    """Raised inside a download thread when the run is being abandoned."""


class _PartFile(io.FileIO):
    """The partial file, opened without truncating it and written unbuffered (every byte written is in the file
    even if the process is killed), reporting each write (and a truncation, when a server ignored the Range) and
    refusing to go on once the run is stopped."""

    def __init__(self, path: Path, on_bytes: Callable[[int], None], stop: threading.Event) -> None:
        super().__init__(path, "r+", opener=lambda name, flags: os.open(name, flags | os.O_CREAT, 0o644))
        self.seek(0, io.SEEK_END)
        self._on_bytes = on_bytes
        self._stop = stop

    def write(self, data: Any) -> int:
        if self._stop.is_set():
            raise _Stopped
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            n = super().write(view[written:])
            if not n:
                raise OSError(f"cannot write to {self.name}")
            written += n
        self._on_bytes(written)
        return written

    def truncate(self, size: int | None = None) -> int:
        before = os.fstat(self.fileno()).st_size
        after = super().truncate(size)  # at the current position when size is None; the position stays
        self._on_bytes(after - before)
        return after


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

    def plan(self, files: Iterable[LockedFile], *, fresh: bool) -> list[_Job]:
        jobs = []
        for f in files:
            part = partial_path(self.model_dir, f.path)
            if fresh:
                part.unlink(missing_ok=True)
            kept = part.stat().st_size if part.is_file() else 0
            if kept > f.size:  # longer than the locked file: not a prefix of it
                part.unlink()
                kept = 0
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
        try:
            failures = [e for e in (done.get() for _ in threads) if e is not None]
        except BaseException:
            self.stop.set()
            raise
        if failures:
            raise next((e for e in failures if not isinstance(e, _Stopped)), failures[0])

    def _advance(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_fetched += nbytes
        if self.progress is not None:
            self.progress.advance(nbytes)

    def _fetch(self, job: _Job) -> None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils._headers import build_hf_headers
        from huggingface_hub.utils.tqdm import silent_tqdm

        f = job.file
        url = hf_hub_url(self.repo, f.path, revision=self.revision, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, endpoint=self.endpoint, retry_on_errors=True)
        if meta.commit_hash is not None and meta.commit_hash != self.revision:
            raise CheckFailed(f"the Hub answered {f.path} from commit {meta.commit_hash}, not {self.revision}")
        if meta.size is not None and meta.size != f.size:
            raise CheckFailed(
                f"the Hub serves {meta.size:,} bytes for {f.path} at {self.revision}; the lock says {f.size:,}",
                hint="check that the lock belongs to this repository and revision",
            )
        job.part.parent.mkdir(parents=True, exist_ok=True)
        headers = build_hf_headers()
        headers["Accept-Encoding"] = "identity"  # byte offsets must be those of the file, not of a gzip stream
        with _PartFile(job.part, self._advance, self.stop) as handle:
            try:  # two runs appending to one partial file would interleave their bytes
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BadInput(
                    f"another download is writing {job.part}", hint="wait for it to finish, or stop it"
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
        target = self.model_dir / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        job.part.replace(target)


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
    endpoint = hub_endpoint(endpoint)
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise BadInput(f"--model-dir {model_dir} exists and is not a directory")
    lock, path, created = resolve_lock(repo, revision, model_dir, lock_path, endpoint=endpoint)
    model_dir.mkdir(parents=True, exist_ok=True)
    fetcher = _Fetcher(repo, revision, model_dir, endpoint, progress, max_workers)

    def present(f: LockedFile) -> bool:
        target = model_dir / f.path
        return target.is_file() and target.stat().st_size == f.size

    planned = fetcher.plan([f for f in lock.files if not present(f)], fresh=False)
    with hub_errors(repo, revision):
        fetcher.run(planned)
    report = verify_checkpoint(model_dir, path, jobs=jobs, progress=verify_progress)

    continued = {j.file.path: j.file for j in planned if j.kept > 0}
    retry = [continued[m.path] for m in report.hash_mismatch if m.path in continued]
    if retry:  # the bytes kept from an earlier run were not the locked file's: fetch those files whole
        for f in retry:
            (model_dir / f.path).unlink(missing_ok=True)
        with hub_errors(repo, revision):
            fetcher.run(fetcher.plan(retry, fresh=True))
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
        verify=report,
    )
    if not report.ok:
        raise CheckFailed(
            f"downloaded files do not match the lock {path}: {report.summary}",
            hint="delete the listed files and run download again",
        )
    return result


__all__ = ["DownloadProgress", "DownloadResult", "download_checkpoint", "partial_path", "resolve_lock"]
