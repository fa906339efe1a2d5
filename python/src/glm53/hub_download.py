"""Download a checkpoint at a pinned revision, then verify it against its lock.

The lock comes first: the one given, the one already in DIR, or a new one made from the Hub's metadata and
written to DIR/checkpoint.lock.json. Exactly the locked files are downloaded with huggingface_hub into DIR
(resumable: partial files wait under DIR/.cache/huggingface/ and continue with HTTP range requests), then
every byte is verified.
"""

from __future__ import annotations

import glob
from pathlib import Path

from pydantic import BaseModel

from glm53.checkpoint_lock import (
    CheckpointLock,
    default_lock_path,
    hub_endpoint,
    hub_errors,
    load_lock,
    lock_from_hub,
    require_full_revision,
    write_lock,
)
from glm53.errors import BadInput, CheckFailed
from glm53.hashing import HashProgress
from glm53.verify import VerifyReport, verify_checkpoint


class DownloadResult(BaseModel):
    repo: str
    revision: str
    model_dir: str
    lock: str
    lock_created: bool
    files: int
    bytes: int
    verify: VerifyReport


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


def download_checkpoint(
    repo: str,
    revision: str,
    model_dir: Path,
    *,
    lock_path: Path | None = None,
    endpoint: str | None = None,
    jobs: int | None = None,
    max_workers: int = 4,
    progress: HashProgress | None = None,
) -> DownloadResult:
    from huggingface_hub import snapshot_download

    require_full_revision(revision)
    endpoint = hub_endpoint(endpoint)
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise BadInput(f"--dir {model_dir} exists and is not a directory")
    lock, path, created = resolve_lock(repo, revision, model_dir, lock_path, endpoint=endpoint)
    model_dir.mkdir(parents=True, exist_ok=True)
    with hub_errors(repo, revision):
        snapshot_download(
            repo,
            revision=revision,
            local_dir=model_dir,
            endpoint=endpoint,
            max_workers=max_workers,
            allow_patterns=[glob.escape(f.path) for f in lock.files],
        )
    report = verify_checkpoint(model_dir, path, jobs=jobs, progress=progress)
    result = DownloadResult(
        repo=repo,
        revision=revision,
        model_dir=str(model_dir),
        lock=str(path),
        lock_created=created,
        files=len(lock.files),
        bytes=lock.total_size,
        verify=report,
    )
    if not report.ok:
        raise CheckFailed(
            f"downloaded files do not match the lock {path}: {report.summary}",
            hint="delete the listed files and run download again",
        )
    return result


__all__ = ["DownloadResult", "download_checkpoint", "resolve_lock"]
