"""A strict safetensors header parser: only the header is read, and every field is checked before use.

Checked: the 8-byte little-endian length is within bounds and within the file; the header is UTF-8 JSON
object without duplicate keys; `__metadata__` maps strings to strings; each tensor has a known dtype,
a shape of non-negative integers and `data_offsets` whose span equals dtype size x elements; spans lie inside
the data section, do not overlap, and cover it without holes (as the safetensors loader requires).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.errors import BadInput

# Same ceiling as the safetensors library: a header above this is hostile or corrupt.
MAX_HEADER_SIZE = 100_000_000

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    path: Path
    header_size: int
    file_size: int
    header_sha256: str
    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]

    @property
    def data_start(self) -> int:
        return 8 + self.header_size

    @property
    def tensor_bytes(self) -> int:
        return sum(entry.nbytes for entry in self.tensors.values())


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Read and validate the header of one safetensors file; BadInput names the file and the defect."""
    path = Path(path)
    try:
        # O_NONBLOCK and a regular-file check: a FIFO named *.safetensors must not block the reader forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise BadInput(f"{path} is a directory, not a safetensors file")
            if not stat.S_ISREG(info.st_mode):
                raise BadInput(f"{path} is not a regular file (a FIFO or a device)", fix="replace it with the file")
            os.set_blocking(fd, True)
            file_size = info.st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _bad(path, f"file is {file_size} bytes, shorter than the 8-byte header length")
            (header_size,) = struct.unpack("<Q", prefix)
            if header_size > MAX_HEADER_SIZE:
                raise _bad(path, f"header length {header_size} exceeds the {MAX_HEADER_SIZE}-byte limit")
            if 8 + header_size > file_size:
                raise _bad(path, f"header length {header_size} runs past the end of the {file_size}-byte file")
            raw = handle.read(header_size)
    except FileNotFoundError as exc:
        raise BadInput(f"safetensors file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise BadInput(f"{path} is a directory, not a safetensors file") from exc
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from exc
    if len(raw) != header_size:
        raise _bad(path, "file shrank while its header was read")
    return parse_header_bytes(path, raw, file_size)


def parse_header_bytes(path: Path, raw: bytes, file_size: int) -> SafetensorsHeader:
    """Validate header bytes already read from `path` (a file of `file_size` bytes)."""
    header_size = len(raw)
    if not raw.startswith(b"{"):
        raise _bad(path, "header is not a JSON object")
    try:
        parsed = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise _bad(path, f"header is not UTF-8 ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise _bad(path, f"header is not valid JSON ({exc.msg} at byte {exc.pos})") from exc
    except _DuplicateKey as exc:
        raise _bad(path, f"header repeats the key {exc.key!r}") from exc
    except RecursionError as exc:
        raise _bad(path, "header JSON is nested too deeply") from exc
    except ValueError as exc:  # the same limits as fsutil.parse_json: e.g. an integer of more than 4300 digits
        raise _bad(path, f"header JSON cannot be read: {exc}") from exc
    if not isinstance(parsed, dict):
        raise _bad(path, "header is not a JSON object")

    metadata = parsed.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _bad(path, "__metadata__ must map strings to strings")

    data_size = file_size - 8 - header_size
    tensors: dict[str, TensorEntry] = {}
    for name, value in parsed.items():
        tensors[name] = _tensor_entry(path, name, value, data_size)

    # Spans must tile the data section exactly: no overlap, no hole, nothing after the last tensor.
    expected_start = 0
    for name, entry in sorted(tensors.items(), key=lambda item: item[1].data_offsets):
        begin, end = entry.data_offsets
        if begin < expected_start:
            raise _bad(path, f"tensor {name!r} bytes [{begin}, {end}) overlap the previous tensor")
        if begin > expected_start:
            raise _bad(path, f"tensor {name!r} starts at {begin}, leaving a hole after byte {expected_start}")
        expected_start = end
    if expected_start != data_size:
        raise _bad(path, f"tensors cover {expected_start} of the {data_size} bytes of the data section")

    return SafetensorsHeader(
        path=path,
        header_size=header_size,
        file_size=file_size,
        header_sha256=hashlib.sha256(raw).hexdigest(),
        metadata=dict(metadata),
        tensors=tensors,
    )


def _tensor_entry(path: Path, name: str, value: Any, data_size: int) -> TensorEntry:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise _bad(path, f"tensor {name!r} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(dim) for dim in shape):
        raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise _bad(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if begin > end:
        raise _bad(path, f"tensor {name!r} data_offsets [{begin}, {end}) end before they begin")
    if end > data_size:
        raise _bad(path, f"tensor {name!r} bytes [{begin}, {end}) lie outside the {data_size}-byte data section")
    expected = DTYPE_SIZES[dtype] * math.prod(shape)
    if end - begin != expected:
        raise _bad(path, f"tensor {name!r} spans {end - begin} bytes but {dtype} x {shape} needs {expected}")
    return TensorEntry(dtype=dtype, shape=tuple(shape), data_offsets=(begin, end))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _bad(path: Path, problem: str) -> BadInput:
    return BadInput(
        f"{path}: invalid safetensors header: {problem}",
        fix="the file is corrupt or not a safetensors file; download it again",
    )


__all__ = ["DTYPE_SIZES", "MAX_HEADER_SIZE", "SafetensorsHeader", "TensorEntry", "read_safetensors_header"]
