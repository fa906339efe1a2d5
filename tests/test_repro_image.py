"""`glm53 repro audit-image` on docker-archive tarballs laid out as streamLayeredImage streams them."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from glm53.repro.image import compare_image_tarballs
from tests.support.cli import run_glm53


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
