"""The strict safetensors header parser, on real files and on hostile ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from glm53.checkpoint.safetensors_header import MAX_HEADER_SIZE, read_safetensors_header
from glm53.errors import BadInput
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint


def raw_file(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


def test_headers_of_the_tiny_checkpoint_agree_with_the_safetensors_library(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ck")
    files = sorted(root.glob("*.safetensors"))
    assert {f.name for f in files} >= {"kpool_aux.safetensors", "mtp.safetensors"}
    for file in files:
        header = read_safetensors_header(file)
        with safe_open(str(file), framework="numpy") as reference:
            assert set(header.tensors) == set(reference.keys())
            assert header.metadata == reference.metadata()
        assert header.data_start + header.tensor_bytes == file.stat().st_size
    mul1 = read_safetensors_header(root / "model-00002-of-00003.safetensors").tensors[
        "model.language_model.layers.3.mlp.experts.0.gate_proj.mul1"
    ]
    assert (mul1.dtype, mul1.shape, mul1.nbytes) == ("I32", (), 4)


def test_header_sha256_covers_the_header_bytes_only(tmp_path: Path) -> None:
    a = raw_file(tmp_path / "a.safetensors", {"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"ab")
    b = raw_file(tmp_path / "b.safetensors", {"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"xy")
    assert read_safetensors_header(a).header_sha256 == read_safetensors_header(b).header_sha256


T = {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        (b"{}", b"", MAX_HEADER_SIZE + 1, "exceeds"),
        (b"{}", b"", 4096, "runs past the end"),
        (b"not json", b"", None, "not a JSON object"),
        (b'{"a": ', b"", None, "not valid JSON"),
        (b"{\xff\xfe}", b"", None, "not UTF-8"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        (b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "t": {}}', b"x", None, "repeats the key"),
        ({"t": {**T, "dtype": "Q4"}}, bytes(8), None, "unknown dtype"),
        ({"t": {**T, "shape": [2, -2]}}, bytes(8), None, "invalid shape"),
        ({"t": {**T, "shape": [2, True]}}, bytes(8), None, "invalid shape"),
        ({"t": {**T, "data_offsets": [0]}}, bytes(8), None, "invalid data_offsets"),
        ({"t": {**T, "data_offsets": [8, 0]}}, bytes(8), None, "end before they begin"),
        ({"t": {**T, "data_offsets": [0, 6]}}, bytes(8), None, "needs 8"),
        ({"t": {**T, "data_offsets": [0, 16]}}, bytes(8), None, "outside the 8-byte data section"),
        ({"t": T, "u": {**T, "data_offsets": [4, 12]}}, bytes(16), None, "overlap"),
        ({"t": {**T, "data_offsets": [8, 16]}}, bytes(16), None, "hole"),
        ({"t": T}, bytes(12), None, "cover 8 of the 12 bytes"),
        ({"t": {**T, "extra": 1}}, bytes(8), None, "exactly dtype, shape and data_offsets"),
        ({"__metadata__": {"k": 1}}, b"", None, "__metadata__"),
        (b"{" + b'"a":' * 0 + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", None, "invalid safetensors header"),
    ],
)
def test_hostile_headers_are_refused_naming_the_file(
    tmp_path: Path, header: object, data: bytes, length: int | None, message: str
) -> None:
    path = raw_file(tmp_path / "evil.safetensors", header, data, length=length)
    with pytest.raises(BadInput) as caught:
        read_safetensors_header(path)
    assert str(path) in caught.value.message
    assert message in caught.value.message


def test_short_and_missing_files(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x00")
    with pytest.raises(BadInput, match="shorter than the 8-byte"):
        read_safetensors_header(short)
    with pytest.raises(BadInput, match="not found"):
        read_safetensors_header(tmp_path / "absent.safetensors")
