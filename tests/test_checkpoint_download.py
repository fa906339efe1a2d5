"""`glm53 model download` against a local server speaking the Hub's API: resuming within a run and across
runs (a killed process, retries exhausted, kept bytes of the wrong content), progress, refusals."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

from glm53.checkpoint.hub import download_checkpoint, partial_path
from glm53.checkpoint.lock import (
    LOCK_FILENAME,
    load_lock,
    lock_from_directory,
    write_lock,
)
from tests.support.cli import run_glm53
from tests.support.fake_hub import REPO, REV, FakeHub, download_args, serve_repo
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

BIG = "blob.bin"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = write_tiny_glm53_checkpoint(tmp_path / "src")
    # One file above huggingface_hub's 10 MiB download chunk (whole chunks reach the disk), so a transfer
    # broken after the first chunk leaves bytes to resume from.
    (root / BIG).write_bytes(os.urandom(DOWNLOAD_CHUNK_SIZE + 2 * 1024 * 1024))
    return root


@pytest.fixture
def hub(source: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve_repo(source, monkeypatch) as server:
        yield server


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def partials(model_dir: Path) -> list[Path]:
    return sorted(partial_path(model_dir, "x").parent.rglob("*.part"))


def kept_partial(source: Path, target: Path, kept: bytes) -> Path:
    """`target` locked to `source` and holding `kept` as BIG's partial file, as an earlier run left it."""
    target.mkdir()
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), target / LOCK_FILENAME)
    part = partial_path(target, BIG)
    part.parent.mkdir(parents=True)
    part.write_bytes(kept)
    return part


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_download_makes_a_lock_downloads_and_verifies(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    target = tmp_path / "dl"
    hub.drop_after[BIG] = 11 * 1024 * 1024  # the connection breaks once, mid-file
    result = run_glm53(*download_args(target), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["lock_created"] is True and payload["verify"]["ok"] is True
    assert same_files(source, target)
    lock = load_lock(target / LOCK_FILENAME)
    assert (lock.repo, lock.revision, lock.source) == (REPO, REV, "hub")
    resumed = [
        r
        for r in hub.requests
        if r.method == "GET" and r.path.endswith(BIG) and r.range and not r.range.startswith("bytes=0-")
    ]
    assert resumed, "the broken transfer was resumed with a Range request"
    assert not partials(target)

    again = run_glm53(*download_args(target))
    assert again.code == 0, again.stderr
    assert "all 8 files match" in again.stdout


def test_download_against_a_given_lock_fetches_only_locked_files(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "kpool_aux.safetensors"):
        (partial / name).write_bytes((source / name).read_bytes())
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(partial, repo=REPO, revision=REV), lock_path)
    target = tmp_path / "dl"
    result = run_glm53(*download_args(target), "--checkpoint-lock", str(lock_path))
    assert result.code == 0, result.stderr
    assert sorted(p.name for p in target.iterdir() if p.is_file()) == ["config.json", "kpool_aux.safetensors"]


def test_download_detects_content_that_differs_from_the_lock(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), lock_path)
    tampered = bytearray((source / "mtp.safetensors").read_bytes())
    tampered[-1] ^= 0xFF
    (source / "mtp.safetensors").write_bytes(bytes(tampered))
    hub.add_repo(REPO, REV, source)  # the server now serves different bytes for the pinned revision
    result = run_glm53(*download_args(tmp_path / "dl"), "--checkpoint-lock", str(lock_path))
    assert result.code == 1
    assert "hash mismatch" in result.stderr and "mtp.safetensors" in result.stderr


def test_download_refuses_a_file_the_hub_serves_at_another_size(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), lock_path)
    (source / "mtp.safetensors").write_bytes((source / "mtp.safetensors").read_bytes() + b" ")
    hub.add_repo(REPO, REV, source)
    target = tmp_path / "dl"
    result = run_glm53(*download_args(target), "--checkpoint-lock", str(lock_path))
    assert result.code == 1 and "mtp.safetensors" in result.stderr and "the lock says" in result.stderr
    assert not hub.gets("mtp.safetensors") and not (target / "mtp.safetensors").exists()


def test_download_refuses_a_branch_name_and_a_mismatched_lock(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    result = run_glm53("model", "download", REPO, "--revision", "3.05bpw", "--model-dir", str(tmp_path / "dl"))
    assert result.code == 2 and "40-hex" in result.stderr
    lock_path = tmp_path / "other.lock.json"
    write_lock(lock_from_directory(source, repo="someone/else", revision=REV), lock_path)
    result = run_glm53(*download_args(tmp_path / "dl"), "--checkpoint-lock", str(lock_path))
    assert result.code == 2 and "someone/else" in result.stderr
    assert not [r for r in hub.requests if "/resolve/" in r.path]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_an_interrupted_download_continues_from_the_bytes_on_disk(
    hub: FakeHub, source: Path, tmp_path: Path, sig: signal.Signals, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stalled transfer must stay stalled until the signal lands: with huggingface_hub's default read
    # timeout (10 s) a slow machine would see it time out, resume with a Range request and finish first.
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "600")
    target = tmp_path / "dl"
    part = partial_path(target, BIG)
    size = (source / BIG).stat().st_size
    hub.stall_after[BIG] = DOWNLOAD_CHUNK_SIZE
    code = "import sys; from glm53.cli.main import main; sys.argv[0] = 'glm53'; main()"
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(
            [sys.executable, "-c", code, *download_args(target), "--json"],
            stdout=log,
            stderr=subprocess.STDOUT,
            # A shell that starts a job in the background has it ignore SIGINT, and Python then installs no
            # Ctrl-C handler: give the download the default disposition a terminal user's command has.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            wait_for(hub.stalled.is_set, "the transfer to stall")
            wait_for(
                lambda: part.is_file() and part.stat().st_size == DOWNLOAD_CHUNK_SIZE,
                "the first chunk to reach the disk",
            )
            first.send_signal(sig)
            first.wait(timeout=30)
        finally:
            hub.release.set()
            if first.poll() is None:
                first.kill()
                first.wait()
    log_text = (tmp_path / "first.log").read_text(errors="replace")
    assert first.returncode != 0, log_text
    if sig == signal.SIGINT:
        assert first.returncode == 130 and "run the same command again to continue" in log_text
    assert not (target / BIG).exists()
    kept = part.stat().st_size
    assert 0 < kept < size

    seen = len(hub.requests)
    again = run_glm53(*download_args(target), "--json")
    assert again.code == 0, again.stderr
    payload = again.json()
    assert payload["verify"]["ok"] is True and payload["refetched"] == []
    assert payload["bytes_resumed"] >= kept
    second = [r for r in hub.requests[seen:] if r.method == "GET" and r.path.endswith(BIG)]
    assert [r.range for r in second] == [f"bytes={kept}-"]  # only the missing bytes, in one request
    assert same_files(source, target)
    assert not partials(target)


def test_a_download_that_exhausts_its_retries_keeps_its_bytes_for_the_next_run(
    hub: FakeHub, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.file_download as file_download

    monkeypatch.setattr(file_download.time, "sleep", lambda seconds: None)  # its pause between retries
    target = tmp_path / "dl"
    hub.cut_at[BIG] = DOWNLOAD_CHUNK_SIZE  # the network stays broken past the first chunk
    first = run_glm53(*download_args(target), "--json")
    assert first.code == 3 and "cannot reach the Hub" in first.stderr
    tries = hub.gets(BIG)
    assert tries[0].range is None and len(tries) > 5
    assert all(r.range == f"bytes={DOWNLOAD_CHUNK_SIZE}-" for r in tries[1:])
    assert partial_path(target, BIG).stat().st_size == DOWNLOAD_CHUNK_SIZE

    del hub.cut_at[BIG]
    seen = len(hub.requests)
    again = run_glm53(*download_args(target), "--json")
    assert again.code == 0, again.stderr
    second = [r for r in hub.requests[seen:] if r.method == "GET" and r.path.endswith(BIG)]
    assert [r.range for r in second] == [f"bytes={DOWNLOAD_CHUNK_SIZE}-"]
    assert same_files(source, target)


def test_kept_bytes_of_other_content_are_caught_by_the_verify_and_fetched_again(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "dl"
    kept_partial(source, target, os.urandom(5 * 1024 * 1024))  # same length as a real prefix, other bytes
    result = run_glm53(*download_args(target), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["refetched"] == [BIG] and payload["verify"]["ok"] is True
    assert [r.range for r in hub.gets(BIG)] == [f"bytes={5 * 1024 * 1024}-", None]
    assert same_files(source, target)
    assert not partials(target)


def test_a_server_that_ignores_the_range_gets_the_partial_rewritten_from_byte_0(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "dl"
    kept = 3 * 1024 * 1024
    kept_partial(source, target, (source / BIG).read_bytes()[:kept])
    hub.ignore_range.add(BIG)
    progress = RecordingProgress()
    result = download_checkpoint(REPO, REV, target, endpoint=hub.url, progress=progress)
    assert [r.range for r in hub.gets(BIG)] == [f"bytes={kept}-"]  # asked for the rest, got the whole file
    assert result.verify.ok and result.refetched == []
    total = progress.starts[0][0]
    assert progress.advanced == total - kept  # the truncated bytes were taken back off the bar
    assert result.bytes_fetched == total - kept
    assert same_files(source, target)


def test_a_partial_file_another_download_is_writing_is_refused(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    target = tmp_path / "dl"
    part = kept_partial(source, target, (source / BIG).read_bytes()[:1024])
    with open(part, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        result = run_glm53(*download_args(target))
    assert result.code == 2 and "another download is writing" in result.stderr
    assert part.read_bytes() == (source / BIG).read_bytes()[:1024]
    assert not hub.gets(BIG)


class RecordingProgress:
    def __init__(self) -> None:
        self.starts: list[tuple[int, int, int]] = []
        self.advanced = 0

    def start(self, total_bytes: int, files: int, done: int = 0) -> None:
        self.starts.append((total_bytes, files, done))

    def advance(self, nbytes: int) -> None:
        self.advanced += nbytes


def test_progress_covers_the_whole_download_and_starts_from_the_kept_bytes(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "dl"
    kept = 3 * 1024 * 1024
    kept_partial(source, target, (source / BIG).read_bytes()[:kept])  # a true prefix, as a killed run leaves it
    progress = RecordingProgress()
    result = download_checkpoint(REPO, REV, target, endpoint=hub.url, progress=progress)
    total = sum(p.stat().st_size for p in source.iterdir())
    assert progress.starts == [(total, 8, kept)]
    assert progress.advanced == total - kept == result.bytes_fetched
    assert result.bytes_resumed == kept and result.verify.ok
    assert [r.range for r in hub.gets(BIG)] == [f"bytes={kept}-"]


def test_progress_bar_on_a_terminal_and_quiet_with_json(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats stderr as a terminal
    shown = run_glm53(*download_args(tmp_path / "tty"))
    assert shown.code == 0, shown.stderr
    assert "downloading 8 files" in shown.stderr and "verifying 8 files" in shown.stderr
    assert "B/s" in shown.stderr  # the transfer rate column
    quiet = run_glm53(*download_args(tmp_path / "json"), "--json")
    assert quiet.code == 0 and quiet.stderr == ""
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    plain = run_glm53(*download_args(tmp_path / "plain"))
    assert plain.code == 0 and plain.stderr == ""
    assert "fetched 8 of 8 files" in plain.stdout
