"""Verify a checkpoint directory against its lock: every file's size and SHA-256, and nothing extra.

Findings by path: missing, size mismatch (not hashed), hash mismatch, stray `*.safetensors` (loaders glob
them, so one fails the check) and other extra files (reported only). The index is a special case: after
`glm53 model install` it differs from the locked upstream one by design, so a changed index passes when
the kept original (`model.safetensors.index.shards-only.json`) matches the lock and the repaired index is
complete.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from glm53.checkpoint.hashing import HashProgress, hash_with_cache
from glm53.checkpoint.index_repair import check_index
from glm53.checkpoint.lock import (
    INDEX_BACKUP_NAME,
    INDEX_NAME,
    checkpoint_files,
    default_lock_path,
    load_lock,
)
from glm53.errors import BadInput
from glm53.fsutil import resolve_inside


class SizeMismatch(BaseModel):
    path: str
    expected: int
    actual: int


class HashMismatch(BaseModel):
    path: str
    expected: str
    actual: str


class VerifyReport(BaseModel):
    model_dir: str
    lock: str
    files: int
    bytes_total: int
    bytes_hashed: int
    bytes_from_cache: int
    seconds: float
    missing: list[str]
    size_mismatch: list[SizeMismatch]
    hash_mismatch: list[HashMismatch]
    changed_while_hashing: list[str]
    stray_safetensors: list[str]
    extra_files: list[str]
    index_repaired: bool
    ok: bool

    @property
    def summary(self) -> str:
        if self.ok:
            repaired = " (index repaired; original matches the lock)" if self.index_repaired else ""
            return f"all {self.files} files match the lock{repaired}"
        parts = []
        for label, items in (
            ("missing", self.missing),
            ("size mismatch", [m.path for m in self.size_mismatch]),
            ("hash mismatch", [m.path for m in self.hash_mismatch]),
            ("changed while hashing", self.changed_while_hashing),
            ("stray safetensors", self.stray_safetensors),
        ):
            if items:
                parts.append(f"{label}: {', '.join(items)}")
        return "; ".join(parts)


def verify_checkpoint(
    model_dir: Path,
    lock_path: Path | None = None,
    *,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: HashProgress | None = None,
) -> VerifyReport:
    started = time.perf_counter()
    root = Path(model_dir)
    if not root.is_dir():
        raise BadInput(f"model directory not found: {root}", fix="pass the checkpoint directory")
    lock_path = Path(lock_path) if lock_path is not None else default_lock_path(root)
    if not lock_path.exists():
        raise BadInput(
            f"checkpoint lock not found: {lock_path}",
            fix="make one with `glm53 model lock`, or pass --checkpoint-lock FILE",
        )
    lock = load_lock(lock_path)

    missing: list[str] = []
    size_mismatch: list[SizeMismatch] = []
    to_hash: dict[str, Path] = {}
    for entry in lock.files:
        path = resolve_inside(root, PurePosixPath(entry.path), what=f"lock entry {entry.path!r}")
        try:  # one stat: a file that vanishes between two looks must not raise
            info = path.stat()
        except OSError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            missing.append(entry.path)
            continue
        actual = info.st_size
        if actual != entry.size:
            size_mismatch.append(SizeMismatch(path=entry.path, expected=entry.size, actual=actual))
        else:
            to_hash[entry.path] = path

    backup = root / INDEX_BACKUP_NAME
    index_entry = lock.by_path().get(INDEX_NAME)
    check_backup = index_entry is not None and INDEX_BACKUP_NAME not in lock.by_path() and backup.is_file()
    paths = list(to_hash.values()) + ([backup] if check_backup else [])
    outcome = hash_with_cache(paths, jobs=jobs, use_cache=use_cache, progress=progress)
    changed_after: list[str] = []

    locked = lock.by_path()
    # A file that vanished or became a directory/FIFO mid-run is missing now; one that is a regular file
    # again (replaced meanwhile) changed while it was being hashed.
    gone = set(outcome.vanished)
    for rel, path in list(to_hash.items()):
        if path in gone:
            del to_hash[rel]
            (changed_after if path.is_file() else missing).append(rel)
    check_backup = check_backup and backup not in gone
    hash_mismatch = [
        HashMismatch(path=rel, expected=locked[rel].sha256, actual=outcome.sha256[path])
        for rel, path in to_hash.items()
        if outcome.sha256[path] != locked[rel].sha256
    ]
    # A repaired index differs from the locked one in content and usually in size: excused only when the
    # kept original matches the lock and the repaired index is complete.
    index_changed = INDEX_NAME in {m.path for m in hash_mismatch} | {m.path for m in size_mismatch}
    index_repaired = (
        check_backup
        and index_entry is not None
        and index_changed
        and outcome.sha256[backup] == index_entry.sha256
        and _index_complete(root)
    )
    if index_repaired:
        hash_mismatch = [m for m in hash_mismatch if m.path != INDEX_NAME]
        size_mismatch = [m for m in size_mismatch if m.path != INDEX_NAME]

    extras = [rel for rel in checkpoint_files(root) if rel not in locked]
    # Loaders glob the top level only: a safetensors file in a subfolder is merely extra.
    stray = [rel for rel in extras if rel.endswith(".safetensors") and "/" not in rel]
    changed = sorted([rel for rel, path in to_hash.items() if path in outcome.changed_while_hashing] + changed_after)
    ok = not (missing or size_mismatch or hash_mismatch or stray or changed)
    return VerifyReport(
        model_dir=str(root),
        lock=str(lock_path),
        files=len(lock.files),
        bytes_total=lock.total_size,
        bytes_hashed=outcome.bytes_hashed,
        bytes_from_cache=outcome.bytes_cached,
        seconds=round(time.perf_counter() - started, 3),
        missing=missing,
        size_mismatch=size_mismatch,
        hash_mismatch=hash_mismatch,
        changed_while_hashing=changed,
        stray_safetensors=stray,
        extra_files=[rel for rel in extras if rel not in stray],
        index_repaired=index_repaired,
        ok=ok,
    )


def _index_complete(root: Path) -> bool:
    try:
        return check_index(root).ok
    except BadInput:
        return False


__all__ = ["HashMismatch", "SizeMismatch", "VerifyReport", "verify_checkpoint"]
