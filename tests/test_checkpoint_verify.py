"""`glm53 model verify`: findings by path, exit codes, the stat cache, parallel hashing."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from glm53.checkpoint import hashing
from glm53.checkpoint.hashing import StatCache, hash_files, sha256_file
from glm53.checkpoint.index_repair import install
from glm53.checkpoint.lock import LOCK_FILENAME, lock_from_directory, write_lock
from glm53.checkpoint.verify import verify_checkpoint
from glm53.errors import BadInput
from tests.support.cli import run_glm53
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture
def locked(tmp_path: Path) -> Path:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    write_lock(lock_from_directory(root, use_cache=False), root / LOCK_FILENAME)
    return root


@pytest.fixture
def trusting_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Files written a moment ago are inside the racy window; these tests are about the stamps themselves.
    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_passes(locked: Path) -> None:
    result = run_glm53("model", "verify", "--model-dir", str(locked), "--json")
    assert result.code == 0, result.stderr
    report = result.json()
    assert report["ok"] is True
    assert report["files"] == 7
    assert (
        report["bytes_hashed"]
        == report["bytes_total"]
        == sum(p.stat().st_size for p in locked.iterdir() if p.name != LOCK_FILENAME)
    )


def test_each_problem_is_reported_by_path_and_fails(locked: Path) -> None:
    (locked / "config.json").unlink()
    with open(locked / "mtp.safetensors", "ab") as handle:
        handle.write(b"\0")
    flip_byte(locked / SHARD)
    shutil.copy(locked / "kpool_aux.safetensors", locked / "kpool_aux-old.safetensors")
    (locked / "NOTES.txt").write_text("mine")
    result = run_glm53("model", "verify", "--model-dir", str(locked), "--json")
    assert result.code == 1
    report = result.json()
    assert report["ok"] is False
    assert report["missing"] == ["config.json"]
    assert [(m["path"], m["actual"] - m["expected"]) for m in report["size_mismatch"]] == [("mtp.safetensors", 1)]
    assert [m["path"] for m in report["hash_mismatch"]] == [SHARD]
    assert report["hash_mismatch"][0]["actual"] == sha256_file(locked / SHARD)
    assert report["stray_safetensors"] == ["kpool_aux-old.safetensors"]
    assert report["extra_files"] == ["NOTES.txt"]
    human = run_glm53("model", "verify", "--model-dir", str(locked))
    assert human.code == 1
    for needle in (
        "missing",
        "config.json",
        "size mismatch",
        "hash mismatch",
        SHARD,
        "stray safetensors",
        "kpool_aux-old.safetensors",
        "FAILED",
    ):
        assert needle in human.stdout


def test_extra_non_weight_files_do_not_fail(locked: Path) -> None:
    (locked / "README.md").write_text("notes")
    (locked / "old").mkdir()
    shutil.copy(locked / "mtp.safetensors", locked / "old" / "mtp.safetensors")  # not globbed by loaders
    report = verify_checkpoint(locked)
    assert report.ok and report.extra_files == ["README.md", "old/mtp.safetensors"]


def test_warm_verify_answers_from_the_stat_cache(locked: Path, trusting_cache: None) -> None:
    cold = verify_checkpoint(locked)
    warm = verify_checkpoint(locked)
    assert cold.ok and warm.ok
    assert cold.bytes_hashed == cold.bytes_total and cold.bytes_from_cache == 0
    assert warm.bytes_hashed == 0 and warm.bytes_from_cache == warm.bytes_total
    assert (hashing.cache_dir() / "sha256-stat-cache.json").is_file()
    assert not any(p.name.startswith(".") and p.suffix == ".tmp" for p in locked.iterdir())
    no_cache = verify_checkpoint(locked, use_cache=False)
    assert no_cache.bytes_hashed == no_cache.bytes_total


def test_a_content_change_with_mtime_put_back_is_caught(locked: Path, trusting_cache: None) -> None:
    assert verify_checkpoint(locked).ok
    shard = locked / SHARD
    before = shard.stat()
    flip_byte(shard, offset=before.st_size // 2)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    report = verify_checkpoint(locked)
    assert not report.ok
    assert [m.path for m in report.hash_mismatch] == [SHARD]


def test_a_replaced_file_is_not_taken_from_the_cache(locked: Path, trusting_cache: None) -> None:
    assert verify_checkpoint(locked).ok
    shard = locked / SHARD
    replacement = locked / "replacement.tmp-file"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    replacement.write_bytes(bytes(data))
    st = shard.stat()
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(replacement, shard)
    assert not verify_checkpoint(locked).ok


def test_entries_inside_the_racy_window_are_rehashed(locked: Path) -> None:
    assert hashing.RACY_WINDOW_NS > 0
    verify_checkpoint(locked)
    again = verify_checkpoint(locked)
    # The files are younger than the window: their stamps could hide a same-tick write, so no trust.
    assert again.bytes_from_cache == 0 and again.ok


def test_a_corrupt_cache_file_is_ignored(locked: Path, trusting_cache: None) -> None:
    cache_file = hashing.cache_dir() / "sha256-stat-cache.json"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text("{ not json")
    assert verify_checkpoint(locked).ok
    assert StatCache(cache_file)._entries  # rewritten with fresh entries


def test_parallel_and_serial_hashing_agree_with_hashlib(tmp_path: Path) -> None:
    files = []
    for n, size in enumerate((0, 1, hashing.READ_CHUNK + 3, 5000)):
        path = tmp_path / f"f{n}"
        path.write_bytes(os.urandom(size))
        files.append(path)
    expected = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    assert hash_files(files, jobs=1) == expected
    assert hash_files(files, jobs=4) == expected


def test_symlinks_inside_pass_and_leaving_ones_are_bad_input(locked: Path, tmp_path: Path) -> None:
    (locked / "sub").mkdir()
    shutil.move(locked / "config.json", locked / "sub" / "config.json")
    (locked / "config.json").symlink_to(Path("sub") / "config.json")
    lock = lock_from_directory(locked)
    assert "sub/config.json" in {f.path for f in lock.files}
    write_lock(lock, locked / LOCK_FILENAME, force=True)
    assert verify_checkpoint(locked).ok

    outside = tmp_path / "outside.safetensors"
    shutil.move(locked / SHARD, outside)
    (locked / SHARD).symlink_to(outside)
    result = run_glm53("model", "verify", "--model-dir", str(locked))
    assert result.code == 2
    assert SHARD in result.stderr and "outside" in result.stderr


def test_bad_directory_and_missing_lock_are_bad_input(tmp_path: Path) -> None:
    assert run_glm53("model", "verify", "--model-dir", str(tmp_path / "absent")).code == 2
    (tmp_path / "empty").mkdir()
    result = run_glm53("model", "verify", "--model-dir", str(tmp_path / "empty"))
    assert result.code == 2 and "glm53 model lock" in result.stderr
    with pytest.raises(BadInput):
        verify_checkpoint(tmp_path / "empty", tmp_path / "nope.json")


def test_an_installed_checkpoint_still_verifies_against_the_upstream_lock(locked: Path) -> None:
    install(locked)
    report = verify_checkpoint(locked)
    assert report.ok and report.index_repaired
    assert report.extra_files == []
    # A broken repaired index is not excused by the backup.
    index = locked / "model.safetensors.index.json"
    index.write_text(index.read_text().replace("mtp.safetensors", "model-00001-of-00003.safetensors", 1))
    report = verify_checkpoint(locked)
    assert not report.ok and not report.index_repaired


def test_jobs_flag_is_validated(locked: Path) -> None:
    assert run_glm53("model", "verify", "--model-dir", str(locked), "--jobs", "0").code == 2
    assert run_glm53("model", "verify", "--model-dir", str(locked), "--jobs", "3", "--no-cache").code == 0


def test_a_file_written_while_it_is_hashed_is_reported_and_not_cached(tmp_path: Path) -> None:
    target = tmp_path / "growing.bin"
    target.write_bytes(os.urandom(2 * hashing.READ_CHUNK + 1000))

    class WriterDuringHash:
        def start(self, total_bytes: int, files: int) -> None:
            pass

        def advance(self, nbytes: int) -> None:
            # Another process keeps appending: the reader stops at the size the file had when listed.
            with open(target, "ab") as handle:
                handle.write(b"more")

    outcome = hashing.hash_with_cache([target], progress=WriterDuringHash())
    assert outcome.changed_while_hashing == [target]
    assert StatCache().lookup(hashing.FileStamp.of(target.stat())) is None
