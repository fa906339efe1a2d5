"""`glm53 model install`: the index repair and its check, on the tiny GLM-5.3 layout and on bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.checkpoint.index_repair import check_index, install
from glm53.checkpoint.safetensors_header import read_safetensors_header
from tests.support.cli import run_glm53
from tests.support.tiny_glm53 import (
    TinySpec,
    kpool_tensors,
    write_safetensors,
    write_tiny_glm53_checkpoint,
)

INDEX = "model.safetensors.index.json"
BACKUP = "model.safetensors.index.shards-only.json"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_tiny_glm53_checkpoint(tmp_path / "ck")


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def test_the_stock_index_omits_kpool_and_mtp(checkpoint: Path) -> None:
    check = check_index(checkpoint)
    assert not check.ok and check.repairable
    assert set(check.unindexed) == {"kpool_aux.safetensors", "mtp.safetensors"}
    assert len(check.unindexed["kpool_aux.safetensors"]) == 2 * len(TinySpec().dsa_layers) == 4
    result = run_glm53("model", "install", "--model-dir", str(checkpoint), "--check")
    assert result.code == 1
    assert "kpool_aux.safetensors (4)" in result.stdout and "mtp.safetensors (145)" in result.stdout


def test_install_repairs_once_and_keeps_the_original(checkpoint: Path) -> None:
    original = (checkpoint / INDEX).read_bytes()
    result = run_glm53("model", "install", "--model-dir", str(checkpoint), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["changed"] is True
    assert payload["added"] == {"kpool_aux.safetensors": 4, "mtp.safetensors": 145}
    assert (checkpoint / BACKUP).read_bytes() == original

    index = json.loads((checkpoint / INDEX).read_text())
    headers = {p.name: read_safetensors_header(p) for p in checkpoint.glob("*.safetensors")}
    expected = {t: f for f, h in headers.items() for t in h.tensors}
    assert index["weight_map"] == expected
    assert index["metadata"]["total_size"] == sum(h.tensor_bytes for h in headers.values())
    assert "model.language_model.layers.7.self_attn.indexer.index_kpool_compress_ape" in index["weight_map"]

    assert run_glm53("model", "install", "--model-dir", str(checkpoint), "--check").code == 0
    stamp = (checkpoint / INDEX).stat().st_mtime_ns
    again = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert again.code == 0 and "nothing to change" in again.stdout
    assert (checkpoint / INDEX).stat().st_mtime_ns == stamp
    assert (checkpoint / BACKUP).read_bytes() == original


def test_a_tensor_in_two_files_is_refused(checkpoint: Path) -> None:
    # A stray kpool file from another quant: same names, and the loader would glob it too.
    shutil.copy(checkpoint / "kpool_aux.safetensors", checkpoint / "kpool_aux.4.05bpw.safetensors")
    before = snapshot(checkpoint)
    result = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert result.code == 1
    assert "more than one file" in result.stderr and "kpool_aux.4.05bpw.safetensors" in result.stderr
    assert snapshot(checkpoint) == before


def test_generic_checkpoints_without_a_spec_refuse_duplicates_too(checkpoint: Path) -> None:
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "glm4_moe"}))
    shutil.copy(checkpoint / "mtp.safetensors", checkpoint / "mtp-copy.safetensors")
    check = check_index(checkpoint)
    assert check.spec is None and check.duplicates
    (checkpoint / "mtp-copy.safetensors").unlink()
    result = install(checkpoint)
    assert result.changed and result.after.ok and result.after.spec is None


def test_a_checkpoint_that_does_not_match_the_spec_is_reported(checkpoint: Path, tmp_path: Path) -> None:
    spec = TinySpec()
    kpool = {}
    for layer in spec.dsa_layers[:-1]:  # the last DSA layer's pair is missing
        kpool |= kpool_tensors(spec, layer)
    import numpy as np

    write_safetensors(checkpoint / "kpool_aux.safetensors", kpool, np.random.default_rng(1))
    before = snapshot(checkpoint)
    result = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert result.code == 1
    assert "glm53-flash-exl3" in result.stderr and "lacks 2 kpool tensors" in result.stderr
    assert snapshot(checkpoint) == before


def test_a_missing_aux_file_is_reported(checkpoint: Path) -> None:
    (checkpoint / "mtp.safetensors").unlink()
    check = check_index(checkpoint)
    assert any("mtp.safetensors is missing" in p for p in check.spec_problems)
    assert run_glm53("model", "install", "--model-dir", str(checkpoint)).code == 1


def test_dangling_index_entries_are_refused(checkpoint: Path) -> None:
    (checkpoint / "model-00003-of-00003.safetensors").unlink()
    result = run_glm53("model", "install", "--model-dir", str(checkpoint), "--check", "--json")
    assert result.code == 1
    assert result.json()["before"]["dangling"][0]["reason"] == "file missing"
    assert run_glm53("model", "install", "--model-dir", str(checkpoint)).code == 1
    assert not (checkpoint / BACKUP).exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: json.dumps({"weight_map": []}), "weight_map"),
        (
            lambda text: text.replace('"model-00001-of-00003.safetensors"', '"../model-00001-of-00003.safetensors"', 1),
            "must be relative",
        ),
        (lambda text: text.replace('"model-00001-of-00003.safetensors"', '"/etc/passwd"', 1), "must be relative"),
        (lambda text: json.dumps({**json.loads(text), "metadata": {"total_size": "big"}}), "total_size"),
    ],
)
def test_a_malformed_index_is_bad_input(checkpoint: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path = checkpoint / INDEX
    path.write_text(edit(path.read_text()))
    before = snapshot(checkpoint)
    result = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert result.code == 2
    assert INDEX in result.stderr and message in result.stderr
    assert snapshot(checkpoint) == before


def test_a_hostile_header_is_bad_input(checkpoint: Path) -> None:
    aux = checkpoint / "kpool_aux.safetensors"
    aux.write_bytes((2**40).to_bytes(8, "little") + aux.read_bytes()[8:])
    before = snapshot(checkpoint)
    result = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert result.code == 2 and "kpool_aux.safetensors" in result.stderr
    assert snapshot(checkpoint) == before


def test_an_aux_symlink_leaving_the_directory_is_bad_input(checkpoint: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(checkpoint / "mtp.safetensors", outside / "mtp.safetensors")
    (checkpoint / "mtp.safetensors").symlink_to(outside / "mtp.safetensors")
    result = run_glm53("model", "install", "--model-dir", str(checkpoint))
    assert result.code == 2 and "outside" in result.stderr


def test_a_missing_model_dir_or_index_is_bad_input(tmp_path: Path) -> None:
    assert run_glm53("model", "install", "--model-dir", str(tmp_path / "absent")).code == 2
    (tmp_path / "empty").mkdir()
    result = run_glm53("model", "install", "--model-dir", str(tmp_path / "empty"))
    assert result.code == 2 and INDEX in result.stderr


# --- read-only and full file systems: real ones, mounted for the test -------------------------------


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A real tmpfs at tmp_path/mnt (root only); yields it and a list of mount options to apply later."""
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]
    if subprocess.run(mount, capture_output=True, check=False).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        yield mnt, []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_install_into_a_read_only_dir_is_bad_input(tmpfs: tuple[Path, list[str]]) -> None:
    mnt, _ = tmpfs
    write_tiny_glm53_checkpoint(mnt)
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    before = snapshot(mnt)
    result = run_glm53("model", "install", "--model-dir", str(mnt))
    assert result.code == 2
    assert "read-only" in result.stderr
    assert snapshot(mnt) == before
    assert run_glm53("model", "install", "--model-dir", str(mnt), "--check").code == 1  # checking needs no writes


def fill(mnt: Path, leave: int) -> None:
    """Fill the file system until `leave` bytes (rounded to pages) are free."""
    with open(mnt / "filler", "wb", buffering=0) as handle:
        while True:
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                return
            try:
                handle.write(b"\0" * min(free - leave, 1 << 20))
            except OSError:
                return


@pytest.mark.parametrize("room_for_backup", [False, True])
def test_no_space_left_leaves_the_index_untouched(tmpfs: tuple[Path, list[str]], room_for_backup: bool) -> None:
    mnt, _ = tmpfs
    write_tiny_glm53_checkpoint(mnt)
    # With room for the backup only, the failure comes at the index write, and the backup is taken back.
    fill(mnt, leave=(mnt / INDEX).stat().st_size + 4096 if room_for_backup else 0)
    before = snapshot(mnt)
    result = run_glm53("model", "install", "--model-dir", str(mnt))
    assert result.code == 2
    assert "no space left" in result.stderr
    assert (BACKUP if not room_for_backup else f"{INDEX} ") in result.stderr.replace("\n", " ")
    assert snapshot(mnt) == before
    assert not any(p.name.endswith(".tmp") for p in mnt.iterdir())


def test_a_single_file_checkpoint_needs_no_index(tmp_path: Path) -> None:
    import numpy as np

    root = tmp_path / "single"
    root.mkdir()
    write_safetensors(root / "model.safetensors", kpool_tensors(TinySpec(), 3), np.random.default_rng(2))
    (root / "config.json").write_text(json.dumps({"model_type": "glm4_moe"}))
    check = check_index(root)
    assert check.ok and check.spec is None and check.indexed_tensors == 2
    result = run_glm53("model", "install", "--model-dir", str(root))
    assert result.code == 0 and "nothing to change" in result.stdout
    assert sorted(p.name for p in root.iterdir()) == ["config.json", "model.safetensors"]
    (root / "model-2.safetensors").write_bytes((root / "model.safetensors").read_bytes())
    result = run_glm53("model", "install", "--model-dir", str(root), "--check")
    assert result.code == 2 and INDEX in result.stderr


def test_full_scale_kpool_is_held_to_the_published_totals(tmp_path: Path) -> None:
    import numpy as np

    root = write_tiny_glm53_checkpoint(tmp_path / "full", layers=45, experts=2)
    check = check_index(root)
    # Tiny shapes at the full layer count: the kpool bytes cannot match the published ones.
    assert any("published 22 / 11,545,600" in p for p in check.spec_problems)
    assert run_glm53("model", "install", "--model-dir", str(root)).code == 1

    # The real kpool shapes: gate [128, 4096] and ape [4, 128] in BF16 over DSA layers 3, 7, ..., 43.
    real = TinySpec(layers=45, hidden=4096, index_head_dim=128, index_kpool=4)
    assert real.dsa_layers == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43]
    kpool = {}
    for layer in real.dsa_layers:
        kpool |= kpool_tensors(real, layer)
    write_safetensors(root / "kpool_aux.safetensors", kpool, np.random.default_rng(3))
    config = json.loads((root / "config.json").read_text())
    config["text_config"] |= {"hidden_size": 4096, "index_head_dim": 128, "index_kpool": 4}
    (root / "config.json").write_text(json.dumps(config))
    check = check_index(root)
    assert check.repairable, check.spec_problems
    assert len(check.unindexed["kpool_aux.safetensors"]) == 22
    assert read_safetensors_header(root / "kpool_aux.safetensors").tensor_bytes == 11_545_600
    assert any("differs from the published 3.05bpw build" in n for n in check.spec_notes)
    assert install(root).after.ok
