"""`glm53 model download` with huggingface_hub against a local server speaking the Hub's API."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from glm53.checkpoint_lock import (
    LOCK_FILENAME,
    load_lock,
    lock_from_directory,
    write_lock,
)

from tests.support.cli import run_glm53
from tests.support.fake_hub import FakeHub, serve_fake_hub
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

REPO = "turboderp/GLM-5.3-Flash-exl3"
REV = "332ab457b709b7ba30dd9a448be5de03b80a7ac9"
BIG = "blob.bin"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = write_tiny_glm53_checkpoint(tmp_path / "src")
    # One file above huggingface_hub's 10 MiB download chunk, so a dropped connection resumes with Range.
    (root / BIG).write_bytes(os.urandom(12 * 1024 * 1024))
    return root


@pytest.fixture
def hub(source: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve_fake_hub() as server:
        server.add_repo(REPO, REV, source)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def test_download_makes_a_lock_downloads_and_verifies(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    target = tmp_path / "dl"
    hub.drop_after[BIG] = 11 * 1024 * 1024  # the connection breaks once, mid-file
    result = run_glm53("model", "download", "--repo", REPO, "--revision", REV, "--dir", str(target), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["lock_created"] is True and payload["verify"]["ok"] is True
    assert same_files(source, target)
    lock = load_lock(target / LOCK_FILENAME)
    assert (lock.repo, lock.revision, lock.source) == (REPO, REV, "hub")
    resumed = [r for r in hub.requests if r.method == "GET" and r.path.endswith(BIG) and r.range
               and not r.range.startswith("bytes=0-")]
    assert resumed, "the broken transfer was resumed with a Range request"

    again = run_glm53("model", "download", "--repo", REPO, "--revision", REV, "--dir", str(target))
    assert again.code == 0, again.stderr
    assert "all 8 files match" in again.stdout


def test_download_against_a_given_lock_fetches_only_locked_files(hub: FakeHub, source: Path,
                                                                  tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "kpool_aux.safetensors"):
        (partial / name).write_bytes((source / name).read_bytes())
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(partial, repo=REPO, revision=REV), lock_path)
    target = tmp_path / "dl"
    result = run_glm53("model", "download", "--repo", REPO, "--revision", REV, "--dir", str(target),
                       "--lock", str(lock_path))
    assert result.code == 0, result.stderr
    assert sorted(p.name for p in target.iterdir() if p.is_file()) == ["config.json", "kpool_aux.safetensors"]


def test_download_detects_content_that_differs_from_the_lock(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    lock_path = tmp_path / "pinned.lock.json"
    write_lock(lock_from_directory(source, repo=REPO, revision=REV), lock_path)
    tampered = bytearray((source / "mtp.safetensors").read_bytes())
    tampered[-1] ^= 0xFF
    (source / "mtp.safetensors").write_bytes(bytes(tampered))
    hub.add_repo(REPO, REV, source)  # the server now serves different bytes for the pinned revision
    result = run_glm53("model", "download", "--repo", REPO, "--revision", REV, "--dir", str(tmp_path / "dl"),
                       "--lock", str(lock_path))
    assert result.code == 1
    assert "hash mismatch" in result.stderr and "mtp.safetensors" in result.stderr


def test_download_refuses_a_branch_name_and_a_mismatched_lock(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    result = run_glm53("model", "download", "--repo", REPO, "--revision", "3.05bpw", "--dir", str(tmp_path / "dl"))
    assert result.code == 2 and "40-hex" in result.stderr
    lock_path = tmp_path / "other.lock.json"
    write_lock(lock_from_directory(source, repo="someone/else", revision=REV), lock_path)
    result = run_glm53("model", "download", "--repo", REPO, "--revision", REV, "--dir", str(tmp_path / "dl"),
                       "--lock", str(lock_path))
    assert result.code == 2 and "someone/else" in result.stderr
    assert not [r for r in hub.requests if "/resolve/" in r.path]
