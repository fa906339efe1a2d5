"""Hostile and clumsy input to the four `glm53 model` commands: symlinks leading out of the model directory,
files vanishing mid-verify, JSON bombs, a Hub that is not the Hub, concurrent installs, read-only and full
directories, corrupt downloads, symlinked sub-directories, bad environment variables."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.checkpoint import hashing, index_repair
from glm53.checkpoint.hashing import StatCache
from glm53.checkpoint.hub import partial_path, quarantine_path
from glm53.checkpoint.lock import LOCK_FILENAME, lock_from_directory, write_lock
from glm53.checkpoint.safetensors_header import read_safetensors_header
from glm53.errors import BadInput
from tests.support.cli import run_glm53
from tests.support.fake_hub import REPO, REV, FakeHub, download_args, serve_fake_hub, serve_repo
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

INDEX = "model.safetensors.index.json"
BACKUP = "model.safetensors.index.shards-only.json"
DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "1" * 5000


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = write_tiny_glm53_checkpoint(tmp_path / "src")
    (root / "tok").mkdir()
    (root / "tok" / "vocab.json").write_text('{"a": 1}\n')
    return root


@pytest.fixture
def hub(source: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve_repo(source, monkeypatch) as server:
        yield server


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def lock_args() -> list[str]:
    return ["model", "lock", REPO, "--revision", REV]


def tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


# --- 1. every write of a download stays inside DIR ---------------------------------------------------


@pytest.mark.parametrize("link", ["tok", ".cache", ".cache/glm53/partial/tok"])
def test_download_refuses_a_symlink_leading_out_of_the_directory(
    hub: FakeHub, tmp_path: Path, link: str, source: Path
) -> None:
    target = tmp_path / "dl"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (target / link).parent.mkdir(parents=True)
    (target / link).symlink_to(outside)
    result = run_glm53(*download_args(target))
    assert result.code == 2, result.stderr
    assert "symlink" in result.stderr and str(target / link) in result.stderr and "outside" in result.stderr
    assert tree(outside) == []  # nothing was written through the link
    assert not (target / LOCK_FILENAME).exists()  # nor anything else: the check comes first

    # With the lock already there (made from a clean copy), the same refusal, still before any write.
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), target / LOCK_FILENAME)
    seen = len(hub.requests)
    result = run_glm53(*download_args(target))
    assert result.code == 2 and "symlink" in result.stderr
    assert tree(outside) == [] and not hub.requests[seen:]


def test_a_symlink_inside_the_directory_is_fine(hub: FakeHub, tmp_path: Path, source: Path) -> None:
    target = tmp_path / "dl"
    (target / "real-tok").mkdir(parents=True)
    (target / "tok").symlink_to("real-tok")
    result = run_glm53(*download_args(target))
    assert result.code == 0, result.stderr
    assert (target / "real-tok" / "vocab.json").read_bytes() == (source / "tok" / "vocab.json").read_bytes()


# --- 2. files vanishing during verify ----------------------------------------------------------------


def _replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "other file":
        path.write_bytes(b"other bytes")


@pytest.mark.parametrize("kind", ["deleted", "directory", "fifo", "other file"])
def test_a_file_vanishing_mid_verify_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (root / "small.txt").write_text("small")
    write_lock(lock_from_directory(root, use_cache=False), root / LOCK_FILENAME)
    original = hashing.sha256_file
    calls: list[Path] = []

    def sha256_then_pull_the_rug(path: Path, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(Path(path))
        if len(calls) == 1:  # the big file is hashed first: meanwhile the small one changes
            _replace_with(root / "small.txt", kind)
        return original(path, **kwargs)

    monkeypatch.setattr(hashing, "sha256_file", sha256_then_pull_the_rug)
    result = run_glm53("model", "verify", "--model-dir", str(root), "--no-cache", "--jobs", "1", "--json")
    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = result.json()
    if kind == "other file":  # a regular file again, but not the one listed: changed while hashing
        assert report["changed_while_hashing"] == ["small.txt"] and report["missing"] == []
    else:
        assert report["missing"] == ["small.txt"] and report["changed_while_hashing"] == []
        assert report["hash_mismatch"] == []
    assert report["ok"] is False


def test_a_file_vanishing_while_locking_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(1024 * 1024))
    (root / "small.txt").write_text("small")
    original = hashing.sha256_file

    def sha256_and_delete(path: Path, **kwargs):  # type: ignore[no-untyped-def]
        (root / "small.txt").unlink(missing_ok=True)
        return original(path, **kwargs)

    monkeypatch.setattr(hashing, "sha256_file", sha256_and_delete)
    result = run_glm53("model", "lock", "--model-dir", str(root), "--no-cache", "--jobs", "1")
    assert result.code == 1 and "small.txt" in result.stderr and "vanished" in result.stderr
    assert not (root / LOCK_FILENAME).exists()


# --- 3. every JSON read has the same limits ----------------------------------------------------------


@pytest.mark.parametrize("bomb", [DEEP, f'{{"files": {HUGE_INT}}}'], ids=["deep", "huge-int"])
def test_a_json_bomb_in_a_lock_is_bad_input(tmp_path: Path, bomb: str) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    (root / LOCK_FILENAME).write_text(bomb)
    result = run_glm53("model", "verify", "--model-dir", str(root))
    assert result.code == 2 and LOCK_FILENAME in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", [INDEX, "config.json"])
@pytest.mark.parametrize("bomb", [DEEP, f'{{"weight_map": {HUGE_INT}}}'], ids=["deep", "huge-int"])
def test_a_json_bomb_in_the_index_or_config_is_bad_input(tmp_path: Path, name: str, bomb: str) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    (root / name).write_text(bomb)
    result = run_glm53("model", "install", "--model-dir", str(root))
    assert result.code == 2, result.stderr
    assert name in result.stderr


@pytest.mark.parametrize(
    "header", [b'{"a": ' + b"[" * 100_000, b'{"__metadata__": {}, "x": ' + HUGE_INT.encode() + b"}"]
)
def test_a_json_bomb_in_a_safetensors_header_is_bad_input(tmp_path: Path, header: bytes) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    (root / "mtp.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    result = run_glm53("model", "install", "--model-dir", str(root), "--check")
    assert result.code == 2 and "mtp.safetensors" in result.stderr and "invalid safetensors header" in result.stderr
    result = run_glm53("model", "lock", "--model-dir", str(root))
    assert result.code == 2 and "mtp.safetensors" in result.stderr


@pytest.mark.parametrize("content", [DEEP, f'{{"version": 1, "entries": {HUGE_INT}}}', "not json", "fifo", "dir"])
def test_a_corrupt_stat_cache_never_stops_verify(tmp_path: Path, cache_home: Path, content: str) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    write_lock(lock_from_directory(root, use_cache=False), root / LOCK_FILENAME)
    cache = StatCache().path
    cache.parent.mkdir(parents=True)
    if content == "fifo":
        os.mkfifo(cache)
    elif content == "dir":
        cache.mkdir()
    else:
        cache.write_text(content)
    result = run_glm53("model", "verify", "--model-dir", str(root), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["bytes_from_cache"] == 0  # ignored, everything rehashed
    if content not in ("fifo", "dir"):
        assert json.loads(cache.read_text())["version"] == 1  # and replaced by a good one


def test_a_json_bomb_from_the_hub_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_fake_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        for body in (DEEP, f'{{"sha": {HUGE_INT}}}', '{"sha": "x", "siblings": "no"}'):
            server.canned = (200, "application/json", body.encode())
            result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
            assert result.code == 3, result.stderr
            assert "not the Hub's API" in result.stderr and "Traceback" not in result.stderr


# --- 4. a Hub that answers HTML ----------------------------------------------------------------------


CAPTIVE = b"<!DOCTYPE html><html><body>Please log in to the hotel Wi-Fi</body></html>"


def test_a_captive_portal_is_unavailable_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path
) -> None:
    with serve_fake_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        server.canned = (200, "text/html; charset=utf-8", CAPTIVE)
        result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
        assert result.code == 3, result.stderr
        assert "not the Hub's API" in result.stderr and "text/html" in result.stderr
        assert "HF_ENDPOINT" in result.stderr and server.url in result.stderr
        assert not (tmp_path / "l.json").exists()

        # Downloading against a lock already made: the file requests get the portal too.
        target = tmp_path / "dl"
        target.mkdir()
        write_lock(lock_from_directory(source, repo=REPO, revision=REV), target / LOCK_FILENAME)
        result = run_glm53(*download_args(target))
        assert result.code == 3 and "not the Hub's API" in result.stderr and "HF_ENDPOINT" in result.stderr
        assert tree(target) == [LOCK_FILENAME]


@pytest.mark.parametrize(("status", "code"), [(500, 3), (503, 3), (404, 2), (401, 2)])
def test_hub_error_statuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, code: int) -> None:
    with serve_fake_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        server.canned = (status, "text/html", CAPTIVE)
        result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
        assert result.code == code, result.stderr
        assert "Traceback" not in result.stderr


# --- 5. concurrent installs --------------------------------------------------------------------------


def test_an_install_running_elsewhere_is_named_not_force(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running install holds
        result = run_glm53("model", "install", "--model-dir", str(root))
    finally:
        os.close(fd)
    assert result.code == 2 and "another `glm53 model install`" in result.stderr
    assert "--force" not in result.stderr
    assert not (root / BACKUP).exists()
    assert run_glm53("model", "install", "--model-dir", str(root)).code == 0


@pytest.mark.parametrize("meanwhile", ["backup appears", "index changes"])
def test_an_install_that_lost_a_race_says_run_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    if meanwhile == "backup appears":  # another process, not holding our lock, between the look and the write
        write = index_repair.atomic_write_bytes

        def race_then_write(path: Path, data: bytes, **kwargs):  # type: ignore[no-untyped-def]
            shutil.copy(root / INDEX, root / BACKUP)
            return write(path, data, **kwargs)

        monkeypatch.setattr(index_repair, "atomic_write_bytes", race_then_write)
    else:
        check = index_repair.check_index

        def check_then_race(model_dir: Path) -> index_repair.IndexCheck:
            found = check(model_dir)
            (root / INDEX).write_text((root / INDEX).read_text() + " ")
            return found

        monkeypatch.setattr(index_repair, "check_index", check_then_race)
    result = run_glm53("model", "install", "--model-dir", str(root))
    assert result.code == 1, result.stderr
    assert "meanwhile" in result.stderr and "run `glm53 model install` again" in result.stderr
    assert "--force" not in result.stderr


# --- 6. read-only and full download directories ------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=False).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_a_read_only_download_directory_is_bad_input(hub: FakeHub, source: Path, tmpfs: Path) -> None:
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), tmpfs / LOCK_FILENAME)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    result = run_glm53(*download_args(tmpfs))
    assert result.code == 2, result.stderr
    assert str(tmpfs) in result.stderr and "not writable" in result.stderr
    assert "network" not in result.stderr
    # Without a lock in it either: the lock cannot be written.
    empty = tmpfs / "sub"
    result = run_glm53(*download_args(empty))
    assert result.code == 2 and "network" not in result.stderr


def test_a_read_only_download_directory_without_root(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through mode bits")
    target = tmp_path / "dl"
    target.mkdir()
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), target / LOCK_FILENAME)
    target.chmod(0o555)
    try:
        result = run_glm53(*download_args(target))
    finally:
        target.chmod(0o755)
    assert result.code == 2 and str(target) in result.stderr and "network" not in result.stderr


def test_a_full_download_directory_is_bad_input(hub: FakeHub, source: Path, tmpfs: Path) -> None:
    (source / "blob.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # more than the 1 MiB tmpfs holds
    hub.add_repo(REPO, REV, source)
    result = run_glm53(*download_args(tmpfs))
    assert result.code == 2, result.stderr
    assert "no space left" in result.stderr and "network" not in result.stderr


# --- 7. bytes that fail their sha256 never sit under the final name ----------------------------------


def test_corrupt_bytes_are_quarantined_out_of_the_loaders_sight(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), lock_path)
    tampered = bytearray((source / "mtp.safetensors").read_bytes())
    tampered[-1] ^= 0xFF
    (source / "mtp.safetensors").write_bytes(bytes(tampered))
    hub.add_repo(REPO, REV, source)
    target = tmp_path / "dl"
    result = run_glm53(*download_args(target), "--checkpoint-lock", str(lock_path))
    assert result.code == 1
    assert "hash mismatch" in result.stderr
    where = quarantine_path(target, "mtp.safetensors")
    assert str(where) in result.stderr.replace("\n", "")
    assert not (target / "mtp.safetensors").exists()
    assert where.read_bytes() == bytes(tampered)
    assert not partial_path(target, "mtp.safetensors").exists()
    assert (target / "kpool_aux.safetensors").is_file()  # the good files are in place

    # The Hub fixed: the next run fetches it whole and succeeds; the quarantined bytes are left for inspection.
    (source / "mtp.safetensors").write_bytes(bytes(tampered[:-1]) + bytes([tampered[-1] ^ 0xFF]))
    hub.add_repo(REPO, REV, source)
    again = run_glm53(*download_args(target), "--checkpoint-lock", str(lock_path), "--json")
    assert again.code == 0, again.stderr
    assert [r.range for r in hub.gets("mtp.safetensors")][-1] is None


# --- 8. symlinked sub-directories when locking -------------------------------------------------------


def test_lock_follows_a_symlinked_subdir_inside_and_refuses_one_outside(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    (root / "real").mkdir(parents=True)
    (root / "real" / "a.txt").write_text("a")
    (root / "top.txt").write_text("top")
    (root / "alias").symlink_to("real")
    result = run_glm53("model", "lock", "--model-dir", str(root), "--json")
    assert result.code == 0, result.stderr
    assert [f["path"] for f in result.json()["files"]] == ["alias/a.txt", "real/a.txt", "top.txt"]

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.txt").write_text("b")
    (root / "ext").symlink_to(outside)
    result = run_glm53("model", "lock", "--model-dir", str(root), "--force")
    assert result.code == 2 and "ext" in result.stderr and "outside" in result.stderr

    (root / "ext").unlink()
    (root / "real" / "loop").symlink_to("..")
    result = run_glm53("model", "lock", "--model-dir", str(root), "--force")
    assert result.code == 2 and "/loop is a symlink" in result.stderr and "loops back" in result.stderr


def test_lock_refuses_an_unreadable_subdir(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads through mode bits")
    root = tmp_path / "ck"
    (root / "private").mkdir(parents=True)
    (root / "private" / "x").write_text("x")
    (root / "private").chmod(0)
    try:
        result = run_glm53("model", "lock", "--model-dir", str(root))
    finally:
        (root / "private").chmod(0o755)
    assert result.code == 2 and "private" in result.stderr


# --- 10. the sweep -----------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["huggingface.co", "ftp://example.com", "http://"])
def test_a_malformed_hf_endpoint_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "HF_ENDPOINT" in result.stderr
    result = run_glm53(*download_args(tmp_path / "dl"))
    assert result.code == 2 and "HF_ENDPOINT" in result.stderr


@pytest.mark.parametrize("repo", ["not a repo", "a/b/c", "../../etc"])
def test_a_malformed_repo_id_is_bad_input(hub: FakeHub, tmp_path: Path, repo: str) -> None:
    result = run_glm53("model", "lock", repo, "--revision", REV, "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "not a Hub repository id" in result.stderr
    result = run_glm53("model", "download", repo, "--revision", REV, "--model-dir", str(tmp_path / "d"))
    assert result.code == 2 and "not a Hub repository id" in result.stderr
    assert not hub.requests


def test_a_malformed_hf_token_is_an_error_not_a_traceback(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_\u00e9t\u00e9")
    result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "HF_TOKEN" in result.stderr, result.stderr
    result = run_glm53(*download_args(tmp_path / "dl"))
    assert result.code == 2 and "HF_TOKEN" in result.stderr, result.stderr
    assert not hub.requests


def test_a_lock_listing_tool_files_is_refused(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    lock = lock_from_directory(root, use_cache=False).model_dump(mode="json")
    lock["files"][0]["path"] = ".cache/glm53/partial/x.part"
    (tmp_path / "evil.lock.json").write_text(json.dumps(lock))
    result = run_glm53(
        "model", "verify", "--model-dir", str(root), "--checkpoint-lock", str(tmp_path / "evil.lock.json")
    )
    assert result.code == 2 and "tool file" in result.stderr


def test_a_fifo_or_a_directory_named_safetensors_is_refused_without_blocking(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    os.mkfifo(root / "extra.safetensors")
    with pytest.raises(BadInput, match="not a regular file"):
        read_safetensors_header(root / "extra.safetensors")
    (root / "extra.safetensors").unlink()
    (root / "extra.safetensors").mkdir()
    with pytest.raises(BadInput, match="is a directory"):
        read_safetensors_header(root / "extra.safetensors")


def test_lock_out_is_a_directory(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    result = run_glm53("model", "lock", "--model-dir", str(root), "--out", str(tmp_path), "--force")
    assert result.code == 2 and "is a directory" in result.stderr


def test_a_truncated_range_answer_is_unavailable(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_at["config.json"] = 10  # every GET of the file stops at byte 10
    result = run_glm53(*lock_args(), "--out", str(tmp_path / "l.json"))
    assert result.code == 3 and "config.json" in result.stderr
    assert not (tmp_path / "l.json").exists()
