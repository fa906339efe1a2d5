"""`glm53 model lock`: from a local directory and from the Hub's metadata (a local server speaking its API)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.checkpoint.lock import LOCK_FILENAME, load_lock, lock_from_directory
from glm53.checkpoint.safetensors_header import read_safetensors_header
from glm53.errors import BadInput
from tests.support.cli import run_glm53
from tests.support.fake_hub import REPO, REV, FakeHub, serve_repo
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_tiny_glm53_checkpoint(tmp_path / "ck")


@pytest.fixture
def hub(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve_repo(checkpoint, monkeypatch) as server:
        yield server


def test_lock_from_directory_records_every_file(checkpoint: Path) -> None:
    (checkpoint / ".cache" / "huggingface").mkdir(parents=True)
    (checkpoint / ".cache" / "huggingface" / "state").write_text("tool state")
    (checkpoint / ".git" / "lfs").mkdir(parents=True)
    (checkpoint / ".git" / "lfs" / "object").write_text("a git clone's second copy")
    result = run_glm53("model", "lock", "--model-dir", str(checkpoint), REPO, "--revision", REV, "--json")
    assert result.code == 0, result.stderr
    lock = load_lock(checkpoint / LOCK_FILENAME)
    assert result.json()["lock"] == str(checkpoint / LOCK_FILENAME)
    assert (lock.repo, lock.revision, lock.source, lock.schema_version) == (REPO, REV, "local", 1)
    on_disk = sorted(p.name for p in checkpoint.iterdir() if p.is_file() and p.name != LOCK_FILENAME)
    assert [f.path for f in lock.files] == on_disk
    for entry in lock.files:
        data = (checkpoint / entry.path).read_bytes()
        assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        if entry.path.endswith(".safetensors"):
            header = read_safetensors_header(checkpoint / entry.path)
            assert entry.safetensors is not None
            assert (entry.safetensors.tensors, entry.safetensors.header_sha256) == (
                len(header.tensors),
                header.header_sha256,
            )
        else:
            assert entry.safetensors is None
    assert lock.total_size == sum(f.size for f in lock.files)


def test_an_existing_lock_is_kept_without_force(checkpoint: Path) -> None:
    target = checkpoint / LOCK_FILENAME
    target.write_text("{}")
    refused = run_glm53("model", "lock", "--model-dir", str(checkpoint))
    assert refused.code == 2
    assert "already exists" in refused.stderr and "--force" in refused.stderr
    assert target.read_text() == "{}"
    assert run_glm53("model", "lock", "--model-dir", str(checkpoint), "--force").code == 0
    assert load_lock(target).files


def test_lock_refuses_a_symlink_leaving_the_directory(checkpoint: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"secret")
    (checkpoint / "link.bin").symlink_to(outside)
    result = run_glm53("model", "lock", "--model-dir", str(checkpoint))
    assert result.code == 2
    assert "link.bin" in result.stderr and "outside" in result.stderr
    assert not (checkpoint / LOCK_FILENAME).exists()


def test_lock_of_a_missing_directory_is_bad_input(tmp_path: Path) -> None:
    result = run_glm53("model", "lock", "--model-dir", str(tmp_path / "nope"))
    assert result.code == 2 and "not found" in result.stderr


def _valid_lock(checkpoint: Path) -> dict[str, object]:
    lock = lock_from_directory(checkpoint)
    return lock.model_dump(mode="json")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["files"][0].update(path="../etc/passwd"), "must be relative"),
        (lambda d: d["files"][0].update(path="/etc/passwd"), "must be relative"),
        (lambda d: d["files"][0].update(path="a/./b"), "must be relative"),
        (lambda d: d["files"][0].update(sha256="XYZ"), "64-hex"),
        (lambda d: d["files"][0].update(size=-1), "files.0.size"),
        (lambda d: d["files"].append(dict(d["files"][0])), "listed twice"),
        (lambda d: d.update(total_size=1), "total_size"),
        (lambda d: d.update(schema_version=7), "schema_version"),
        (lambda d: d.update(revision="main"), "40-hex"),
        (lambda d: d.update(surprise=True), "surprise"),
    ],
)
def test_malformed_locks_are_refused_naming_the_field(checkpoint: Path, tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = _valid_lock(checkpoint)
    mutate(data)
    path = tmp_path / "bad.lock.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput) as caught:
        load_lock(path)
    assert str(path) in caught.value.message and message in caught.value.message
    result = run_glm53("model", "verify", "--model-dir", str(checkpoint), "--checkpoint-lock", str(path))
    assert result.code == 2


def test_a_lock_that_is_not_json_is_bad_input(checkpoint: Path) -> None:
    (checkpoint / LOCK_FILENAME).write_text('{"files": [')
    result = run_glm53("model", "verify", "--model-dir", str(checkpoint))
    assert result.code == 2
    assert "not valid JSON" in result.stderr and LOCK_FILENAME in result.stderr


def test_lock_from_hub_matches_the_local_lock_without_downloading_weights(
    checkpoint: Path, hub: FakeHub, tmp_path: Path
) -> None:
    out = tmp_path / "hub.lock.json"
    result = run_glm53("model", "lock", REPO, "--revision", REV, "--out", str(out))
    assert result.code == 0, result.stderr
    from_hub = load_lock(out)
    local = lock_from_directory(checkpoint, repo=REPO, revision=REV)
    assert from_hub.source == "hub"
    assert from_hub.files == local.files
    # Weights are never fetched: only 8-byte prefixes and headers of safetensors files.
    for request in hub.requests:
        if request.method == "GET" and request.path.endswith(".safetensors"):
            assert request.range is not None
            _start, end = (int(x) for x in request.range.removeprefix("bytes=").split("-"))
            name = request.path.rsplit("/", 1)[-1]
            assert end < read_safetensors_header(checkpoint / name).data_start


def test_lock_from_hub_needs_a_full_revision(hub: FakeHub, tmp_path: Path) -> None:
    result = run_glm53("model", "lock", REPO, "--revision", "main", "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "40-hex" in result.stderr
    assert not hub.requests


def test_lock_from_hub_unknown_revision_and_repo(hub: FakeHub, tmp_path: Path) -> None:
    other = "0" * 40
    result = run_glm53("model", "lock", REPO, "--revision", other, "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "not found" in result.stderr and other in result.stderr
    result = run_glm53("model", "lock", "nobody/nothing", "--revision", REV, "--out", str(tmp_path / "l.json"))
    assert result.code == 2 and "nobody/nothing" in result.stderr
    assert not (tmp_path / "l.json").exists()


def test_lock_from_hub_with_an_unreachable_endpoint_fails_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    result = run_glm53("model", "lock", REPO, "--revision", REV, "--out", str(tmp_path / "l.json"))
    assert result.code == 3
    assert "Hub" in result.stderr
    assert not os.path.exists(tmp_path / "l.json")
