"""`glm53 repro audit-image` on docker-archive tarballs laid out as streamLayeredImage streams them."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from glm53.repro.image import compare_image_tarballs
from tests.support.cli import run_glm53
from tests.support.nixenv import NIX_ENV
from tests.support.server import glm53_executable

STREAM_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nix" / "image-stream.nix"


def _tar(members: list[tuple[str, bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data, mtime in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _image(path: Path, *, app_mtime: int = 1) -> Path:
    """manifest.json, the config and two layer tars (the second holding /app/run.py with `app_mtime`)."""
    layers = [
        _tar([("nix/store/aaa-python/bin/python", b"\x7fELF python", 1)]),
        _tar([("app/README", b"glm53\n", 1), ("app/run.py", b"print('glm53')\n", app_mtime)]),
    ]
    names = [f"{hashlib.sha256(layer).hexdigest()}/layer.tar" for layer in layers]
    config = json.dumps({"architecture": "amd64", "rootfs": {"type": "layers"}}).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["glm53:test"], "Layers": names}]).encode()
    outer = [*((name, layer, 1) for name, layer in zip(names, layers, strict=True))]
    path.write_bytes(_tar([*outer, (config_name, config, 1), ("manifest.json", manifest, 1)]))
    return path


def test_two_deterministic_streams_are_identical(tmp_path: Path) -> None:
    a, b = _image(tmp_path / "a.tar"), _image(tmp_path / "b.tar")
    result = run_glm53("repro", "audit-image", "--tarball", str(a), "--tarball", str(b), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["identical"] and result.json()["sha256_a"] == result.json()["sha256_b"]


def test_a_timestamp_names_the_layer_and_the_file(tmp_path: Path) -> None:
    a, b = _image(tmp_path / "a.tar"), _image(tmp_path / "b.tar", app_mtime=1700000000)
    audit = compare_image_tarballs(a, b)
    assert not audit.identical and audit.config_same
    assert [layer.same for layer in audit.layers] == [True, False]
    assert audit.first_difference is not None
    assert audit.first_difference.member == "app/run.py" and audit.first_difference.fields == ["mtime"]
    assert audit.suggestion == f"diffoscope {a} {b}"
    result = run_glm53("repro", "audit-image", "--tarball", str(a), "--tarball", str(b))
    assert result.code == 1 and "app/run.py" in result.stderr and "layer 1" in result.stderr
    assert "diffoscope" in result.stderr


def test_not_an_image_is_bad_input(tmp_path: Path) -> None:
    a = tmp_path / "a.tar"
    a.write_bytes(_tar([("x", b"1", 1)]))
    b = tmp_path / "b.tar"
    b.write_bytes(_tar([("x", b"2", 1)]))
    result = run_glm53("repro", "audit-image", "--tarball", str(a), "--tarball", str(b))
    assert result.code == 2 and "manifest.json" in result.stderr


def _stream_derivation(workdir: Path, first: Path, second: Path) -> str:
    """The store derivation of a script printing `first`, then `second` (tests/fixtures/nix/image-stream.nix);
    its state file lives in a fresh `workdir`, so each call is a new derivation."""
    workdir.mkdir()
    arguments = {"first": first, "second": second, "state": workdir / "streamed-once"}
    made = subprocess.run(
        [
            "nix-instantiate",
            str(STREAM_FIXTURE),
            *(f for name, value in arguments.items() for f in ("--argstr", name, str(value))),
        ],
        capture_output=True,
        text=True,
        env=NIX_ENV,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _audit_image(*args: str) -> subprocess.CompletedProcess[str]:
    # A subprocess, so that nix runs under the tests' own Nix configuration (NIX_ENV).
    command = [*glm53_executable(), "repro", "audit-image", *args]
    return subprocess.run(command, capture_output=True, text=True, env=NIX_ENV, timeout=300)


@pytest.mark.nix
@pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)")
def test_the_nix_path_builds_rebuilds_and_streams_twice(tmp_path: Path) -> None:
    image = _image(tmp_path / "image.tar")
    same = _audit_image(_stream_derivation(tmp_path / "same", image, image), "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["identical"] is True

    later = _image(tmp_path / "later.tar", app_mtime=1700000000)
    keep = tmp_path / "kept"
    keep.mkdir()
    differs = _audit_image(_stream_derivation(tmp_path / "differs", image, later), "--keep", str(keep))
    assert differs.returncode == 1, differs.stderr
    assert "app/run.py" in differs.stderr and "layer 1" in differs.stderr
    assert (keep / "image-a.tar").read_bytes() == image.read_bytes()
    assert (keep / "image-b.tar").read_bytes() == later.read_bytes()


@pytest.mark.nix
@pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)")
def test_a_failing_build_or_rebuild_is_bad_input(tmp_path: Path) -> None:
    missing = tmp_path / "nope.drv"
    result = _audit_image(str(missing))
    assert result.returncode == 2 and f"nix could not build {missing}" in result.stderr
    salt = ["--argstr", "salt", tmp_path.name]
    unstable = subprocess.run(
        ["nix-instantiate", str(STREAM_FIXTURE.parent / "nondeterministic.nix"), *salt],
        capture_output=True,
        text=True,
        env=NIX_ENV,
        timeout=120,
    )
    assert unstable.returncode == 0, unstable.stderr
    rebuilt = _audit_image(unstable.stdout.strip())
    assert rebuilt.returncode == 2 and "a second build of" in rebuilt.stderr and "differs or failed" in rebuilt.stderr
    assert "glm53 repro audit-build" in rebuilt.stderr
