"""Routing statistics: the trace and counts file formats, their readers and writers, and a synthetic
generator.

Trace (JSONL, one JSON object per line):
    line 1  {"format": "glm53-routing-trace", "version": 1, "layers": [3, ..., 44],
             "experts": 288, "top_k": 8}
    then    {"step": 0, "experts": [[e, ...top_k ids], ... one list per layer, in header order]}
One line per decode step (one token of one sequence). Within a layer's list the ids are distinct, in the
router's order (highest score first); the simulator takes them in that order.

Binary trace (.npz, numpy's uncompressed zip of arrays; `write_trace` picks it by the .npz suffix, readers by
its magic bytes): `header`, the same header JSON as uint8 bytes, and `routes`, an integer array (steps, layers,
top_k) in header order. Read with allow_pickle=False and validated like the JSONL form (ids in range, distinct
within a step's layer, shape matching the header); errors name the step.

Counts (JSON): {"format": "glm53-routing-counts", "version": 1, "experts": 288, "tokens": N,
                "layers": {"3": [count of expert 0, count of expert 1, ...], ...}}
Counts carry popularity only (no order in time), so they can rank experts but cannot size an LRU window.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import MAX_INPUT_BYTES, atomic_write_bytes, atomic_write_json, parse_json, read_bytes_bounded
from glm53.host.topology import parse_cpu_list
from glm53.plan.routing.spec import MAX_EXPERTS, SynthesizedTrace, SyntheticTraceSpec, format_shifts

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

TRACE_FORMAT = "glm53-routing-trace"
COUNTS_FORMAT = "glm53-routing-counts"
FORMAT_VERSION = 1
MAX_LAYER_ID = 65535
MAX_COUNT = 1 << 53  # counts and token totals: exact in a float, and 32767 of them sum within int64
# A trace is read whole into memory; 1 GiB is about 200,000 steps of GLM-5.3-Flash's shape (42 layers x top-8).
MAX_TRACE_BYTES = 1 << 30
# Synthetic traces: expert ids written (steps x layers x top_k), and per layer the steps x experts race keys.
MAX_SYNTH_IDS = 1 << 26
MAX_SYNTH_KEYS = 1 << 28
_TRACE_HINT = "see docs/plan.md for the trace format; `glm53 plan trace synth` writes a valid one"

LayerId = Annotated[int, Field(ge=0, le=MAX_LAYER_ID)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class TraceHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    format: str
    version: int
    layers: list[LayerId] = Field(min_length=1)
    experts: int = Field(gt=0, le=MAX_EXPERTS)
    top_k: int = Field(gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> TraceHeader:
        if len(set(self.layers)) != len(self.layers):
            raise ValueError("layers lists a layer twice")
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} exceeds the {self.experts} experts")
        return self


@dataclass(frozen=True)
class RoutingTrace:
    """Expert ids per step, layer and rank: `routes[step, layer_index, k]` (int16)."""

    layers: tuple[int, ...]
    experts: int
    top_k: int
    routes: NDArray[np.int16]

    @property
    def steps(self) -> int:
        return int(self.routes.shape[0])

    def split(self, fraction: float) -> tuple[RoutingTrace, RoutingTrace]:
        """The first `fraction` of the steps (to learn from) and the rest (to score on)."""
        if not 0.0 < fraction < 1.0:
            raise BadInput(f"learn fraction {fraction} must lie strictly between 0 and 1")
        cut = round(self.steps * fraction)
        if cut < 1 or cut >= self.steps:
            raise BadInput(f"a trace of {self.steps} steps is too short to split at {fraction:.0%}")
        return self.slice(0, cut), self.slice(cut, self.steps)

    def slice(self, start: int, stop: int) -> RoutingTrace:
        return RoutingTrace(self.layers, self.experts, self.top_k, self.routes[start:stop])

    def counts(self) -> NDArray[np.int64]:
        """Accesses per (layer index, expert)."""
        import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

        out = np.zeros((len(self.layers), self.experts), dtype=np.int64)
        for index in range(len(self.layers)):
            out[index] = np.bincount(self.routes[:, index, :].ravel(), minlength=self.experts)
        return out

    def to_counts(self) -> RoutingCounts:
        counts = self.counts()
        return RoutingCounts(
            format=COUNTS_FORMAT,
            version=FORMAT_VERSION,
            experts=self.experts,
            tokens=self.steps,
            layers={str(layer): counts[i].tolist() for i, layer in enumerate(self.layers)},
        )


class RoutingCounts(BaseModel):
    # Strict: a count of "12", true or 1.5 is a mistake in the file, not a number to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)

    format: str = COUNTS_FORMAT
    version: int = FORMAT_VERSION
    experts: int = Field(gt=0, le=MAX_EXPERTS)
    tokens: Count
    layers: dict[str, list[Count]]

    @field_validator("layers")
    @classmethod
    def _layer_keys(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        for key in value:
            if not (key.isascii() and key.isdigit() and str(int(key)) == key and int(key) <= MAX_LAYER_ID):
                raise ValueError(f'layer key {key[:20]!r} is not a layer number such as "3"')
        return value

    def matrix(self, layers: Sequence[int]) -> NDArray[np.int64]:
        import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

        out = np.zeros((len(layers), self.experts), dtype=np.int64)
        for i, layer in enumerate(layers):
            if str(layer) in self.layers:
                out[i] = self.layers[str(layer)]
        return out


def _bad_trace(path: Path, line: int, problem: str) -> BadInput:
    return BadInput(f"routing trace {path}, line {line}: {problem}", fix=_TRACE_HINT)


def read_trace(path: Path) -> RoutingTrace:
    path = Path(path)
    data = read_bytes_bounded(path, what="routing trace", max_bytes=MAX_TRACE_BYTES)
    return _parse_npz(path, data) if data.startswith(NPZ_MAGIC) else _parse_trace(path, data)


NPZ_MAGIC = b"PK\x03\x04"


def _parse_npz(path: Path, data: bytes) -> RoutingTrace:
    """The binary form: same header, same checks as the JSONL one, over whole arrays."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive_zip:  # a compressed member may expand: bound it first
            expanded = sum(info.file_size for info in archive_zip.infolist())
            if expanded > MAX_TRACE_BYTES:
                raise _bad_binary(path, f"its arrays expand to {expanded:,} bytes, more than {MAX_TRACE_BYTES:,}")
            for info in archive_zip.infolist():
                _check_npy_header(path, archive_zip, info)
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            if set(archive.files) != {"header", "routes"}:
                raise _bad_binary(path, f"expected the arrays header and routes, found {sorted(archive.files)[:4]}")
            header_bytes = archive["header"]
            routes = archive["routes"]
    except (ValueError, OSError, KeyError, zipfile.BadZipFile) as exc:  # a pickled object array, a broken zip
        raise _bad_binary(path, f"not a readable numpy archive ({str(exc)[:80]})") from exc
    if header_bytes.dtype != np.uint8 or header_bytes.ndim != 1:
        raise _bad_binary(path, "header must be the header JSON as uint8 bytes")
    header = _parse_header(path, header_bytes.tobytes())
    shape = (len(header.layers), header.top_k)
    if routes.dtype.kind not in "iu" or routes.ndim != 3 or routes.shape[1:] != shape or routes.shape[0] < 1:
        raise _bad_binary(
            path,
            f"routes must be integers of shape (steps >= 1, {shape[0]}, {shape[1]}), got {routes.dtype} "
            f"{list(routes.shape)}",
        )
    outside = (routes < 0) | (routes >= header.experts)
    if outside.any():
        step, layer, k = (int(v) for v in np.argwhere(outside)[0])
        raise _bad_binary(
            path,
            f"step {step}, layer {header.layers[layer]}: expert id {int(routes[step, layer, k])} outside "
            f"0..{header.experts - 1}",
        )
    routes = routes.astype(np.int16)
    ordered = np.sort(routes, axis=2)
    twice = (ordered[:, :, 1:] == ordered[:, :, :-1]).any(axis=2)
    if twice.any():
        step, layer = (int(v) for v in np.argwhere(twice)[0])
        raise _bad_binary(path, f"step {step}: layer {header.layers[layer]} lists an expert twice")
    return RoutingTrace(tuple(header.layers), header.experts, header.top_k, routes)


def _check_npy_header(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """The array a member's .npy header declares must fit in the bytes the member holds: numpy allocates the
    declared shape before it reads (a 1 KiB file claiming 10^12 rows would ask for terabytes)."""
    from numpy.lib import format as npy_format  # heavy: numpy loads when a computation needs it

    npy: Any = npy_format  # its header readers are untyped

    with archive.open(info) as member:
        try:
            version = npy.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = npy.read_array_header_1_0(member, max_header_size=1 << 16)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = npy.read_array_header_2_0(member, max_header_size=1 << 16)
            else:
                raise ValueError(f"npy format version {version}")
        except (ValueError, OSError, EOFError) as exc:
            raise _bad_binary(path, f"{info.filename}: not a numpy array ({str(exc)[:80]})") from exc
        header_bytes = member.tell()
    count = 1
    for extent in shape:
        count *= int(extent)
    declared = count * dtype.itemsize
    held = info.file_size - header_bytes
    if dtype.hasobject:
        raise _bad_binary(path, f"{info.filename}: not a readable numpy archive (Python objects are never unpickled)")
    if declared > held:
        raise _bad_binary(
            path,
            f"{info.filename}: its header declares {list(shape)} x {dtype} ({declared:,} bytes), more than the "
            f"{max(held, 0):,} bytes it holds",
        )


def _bad_binary(path: Path, problem: str) -> BadInput:
    return BadInput(f"routing trace {path} (binary): {problem}", fix=_TRACE_HINT)


def _parse_header(path: Path, first: bytes) -> TraceHeader:
    raw = parse_json(first, what=f"routing trace {path}, line 1", fix=_TRACE_HINT)
    try:
        header = TraceHeader.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise _bad_trace(path, 1, f"not a trace header ({where + ': ' if where else ''}{error['msg']})") from exc
    if header.format != TRACE_FORMAT or header.version != FORMAT_VERSION:
        raise _bad_trace(
            path,
            1,
            f"format {header.format!r} version {header.version} is not {TRACE_FORMAT!r} version {FORMAT_VERSION}",
        )
    return header


def _not_an_id(value: Any) -> bool:
    return type(value) is not int  # bool is a subclass of int: true is not expert 1


def _first_non_id(experts: list[Any]) -> tuple[bool, Any]:
    """(True, the first item of a step's lists that is not an integer: a float, string, bool, null, ...), or
    (False, None) when every item is one."""
    for ids in experts:
        for value in ids if isinstance(ids, list) else [ids]:
            if _not_an_id(value):
                return True, value
    return False, None


def _step_row(path: Path, number: int, raw: bytes, header: TraceHeader) -> NDArray[np.int16]:
    """One step line as a (layers, top_k) array of valid expert ids; every problem names this line."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    record = parse_json(raw, what=f"routing trace {path}, line {number}", fix=_TRACE_HINT)
    experts = record.get("experts") if isinstance(record, dict) else None
    if not isinstance(experts, list):
        raise _bad_trace(path, number, 'expected {"step": N, "experts": [[...], ...]}')
    shape = (len(header.layers), header.top_k)
    try:
        row = np.array(experts)
    except (ValueError, TypeError):  # ragged lists
        row = None
    if row is None or row.ndim != 2 or row.shape != shape:
        if row is None or row.ndim != 2 or row.dtype.kind not in "iub":
            found, bad = _first_non_id(experts)
            if found and not isinstance(bad, list):
                raise _bad_trace(path, number, f"expert id {json.dumps(bad)[:40]} is not an integer")
        got = f"shape {list(row.shape)}" if row is not None else "lists of different lengths"
        raise _bad_trace(path, number, f"steps must hold {shape[0]} lists of {shape[1]} ids, got {got}")
    # numpy turns true into 1 within integers; the raw line tells whether any boolean is there at all.
    if row.dtype.kind != "i" or b"true" in raw or b"false" in raw:
        found, bad = _first_non_id(experts)
        if found:
            raise _bad_trace(path, number, f"expert id {json.dumps(bad)[:40]} is not an integer")
    outside = (row < 0) | (row >= header.experts) if row.dtype.kind == "i" else None
    if outside is None or outside.any():
        value = next(v for ids in experts for v in ids if not 0 <= v < header.experts)
        raise _bad_trace(path, number, f"expert id {value} outside 0..{header.experts - 1}")
    ordered = np.sort(row, axis=1)
    dup = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    if dup.size:
        raise _bad_trace(path, number, f"layer {header.layers[int(dup[0])]} lists an expert twice")
    return row.astype(np.int16)


def _parse_trace(path: Path, data: bytes) -> RoutingTrace:
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    lines = io.BytesIO(data)
    header = _parse_header(path, lines.readline())
    rows: list[NDArray[np.int16]] = []
    for number, raw in enumerate(lines, start=2):
        if raw.strip():
            rows.append(_step_row(path, number, raw, header))
    if not rows:
        raise _bad_trace(path, 1, "the trace has a header but no steps")
    return RoutingTrace(tuple(header.layers), header.experts, header.top_k, np.stack(rows))


def write_trace(path: Path, trace: RoutingTrace) -> None:
    """JSONL, or the binary form when the path ends in .npz."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    header = {
        "format": TRACE_FORMAT,
        "version": FORMAT_VERSION,
        "layers": list(trace.layers),
        "experts": trace.experts,
        "top_k": trace.top_k,
    }
    if Path(path).suffix == ".npz":
        buffer = io.BytesIO()
        header_bytes = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        np.savez(buffer, header=header_bytes, routes=np.ascontiguousarray(trace.routes, dtype=np.int16))
        atomic_write_bytes(Path(path), buffer.getvalue())
        return
    lines = [json.dumps(header)]
    for step, row in enumerate(trace.routes.tolist()):
        lines.append(json.dumps({"step": step, "experts": row}, separators=(",", ":")))
    atomic_write_bytes(Path(path), ("\n".join(lines) + "\n").encode())


def read_counts(path: Path) -> RoutingCounts:
    path = Path(path)
    return _parse_counts(path, read_bytes_bounded(path, what="routing counts"))


def _parse_counts(path: Path, data: bytes) -> RoutingCounts:
    raw = parse_json(data, what=f"routing counts {path}", fix="see docs/plan.md for the counts format")
    try:
        counts = RoutingCounts.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"routing counts {path}", fix="see docs/plan.md for the counts format") from exc
    if counts.format != COUNTS_FORMAT:
        raise BadInput(f"routing counts {path}: format {counts.format!r} is not {COUNTS_FORMAT!r}")
    for layer, values in counts.layers.items():
        if len(values) != counts.experts or min(values, default=0) < 0:
            raise BadInput(f"routing counts {path}: layer {layer} needs {counts.experts} non-negative counts")
    return counts


def write_counts(path: Path, counts: RoutingCounts) -> None:
    atomic_write_json(Path(path), counts.model_dump(mode="json"))


def read_routing_stats(path: Path) -> RoutingTrace | RoutingCounts:
    """A trace (JSONL) or a counts file (JSON), told apart by the format field of the first line."""
    path = Path(path)
    data = read_bytes_bounded(path, what="routing statistics", max_bytes=MAX_TRACE_BYTES)
    if data.startswith(NPZ_MAGIC):
        return _parse_npz(path, data)
    first = data[: data.find(b"\n") if b"\n" in data[: 1 << 20] else 1 << 20]
    if TRACE_FORMAT.encode() in first:
        return _parse_trace(path, data)
    if len(data) > MAX_INPUT_BYTES:
        raise BadInput(f"routing counts: {path} is {len(data):,} bytes, more than the {MAX_INPUT_BYTES:,} this takes")
    return _parse_counts(path, data)


# --- synthetic traces ---------------------------------------------------------------------------------------


def parse_layers(text: str, *, flag: str = "--layers") -> tuple[int, ...]:
    """MoE layer ids in the kernel's list format, e.g. 3-44 or 3,5,7-9."""
    layers = parse_cpu_list(text, what=flag)
    if not layers:
        raise BadInput(f"{flag} is empty", fix=f"e.g. {flag} 3-44")
    return layers


def parse_shifts(text: str, *, flag: str = "--shift") -> tuple[tuple[float, float], ...]:
    """'0.5:1.0,0.8:0.3' -> ((0.5, 1.0), (0.8, 0.3)): popularity shifts at a share of the steps, of a strength
    (the share of experts re-permuted); 'none' or '' -> ()."""
    if text.strip().lower() in ("", "none"):
        return ()
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        at, colon, strength = part.strip().partition(":")
        try:
            pair = (float(at), float(strength) if colon else 1.0)
        except ValueError as exc:
            raise BadInput(f"{flag} {part.strip()!r}: expected AT:STRENGTH such as 0.5:1.0") from exc
        if not (0.0 < pair[0] < 1.0 and 0.0 <= pair[1] <= 1.0):
            raise BadInput(f"{flag} {part.strip()!r}: AT must lie in (0, 1) and STRENGTH in [0, 1]")
        out.append(pair)
    return tuple(out)


def shift_permutations(
    experts: int, layers: int, shifts: Sequence[tuple[float, float]], seed: int
) -> list[NDArray[np.int64]]:
    """Per shift, a (layers, experts) relabelling: expert e's popularity passes to perm[layer, e]. A random
    `strength` share of each layer's experts is permuted among itself, the rest keep theirs."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    rng = np.random.default_rng([seed, 0x5317])
    out = []
    for _, strength in shifts:
        perm = np.tile(np.arange(experts, dtype=np.int64), (layers, 1))
        moved = round(strength * experts)
        for layer in range(layers):
            chosen = rng.choice(experts, size=moved, replace=False)
            perm[layer, chosen] = chosen[rng.permutation(moved)]
        out.append(perm)
    return out


def drift_trace(trace: RoutingTrace, shifts: Sequence[tuple[float, float]], seed: int = 0) -> RoutingTrace:
    """The same trace with its popularity shifted: from each shift's step on, expert ids are relabelled by that
    shift's permutation (composed with the earlier ones). Locality and each layer's skew are kept; which experts
    are hot changes."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    routes = trace.routes.astype(np.int64)
    ordered = sorted(shifts)
    for (at, _), perm in zip(ordered, shift_permutations(trace.experts, len(trace.layers), ordered, seed), strict=True):
        start = round(at * trace.steps)
        for index in range(len(trace.layers)):
            routes[start:, index, :] = perm[index][routes[start:, index, :]]
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, routes.astype(np.int16))


def synthesize_trace(spec: SyntheticTraceSpec) -> RoutingTrace:
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    if spec.top_k > spec.experts:
        raise BadInput(f"top_k {spec.top_k} exceeds the {spec.experts} experts")
    if spec.skew_max < spec.skew_min:
        raise BadInput(f"skew range [{spec.skew_min}, {spec.skew_max}] runs backwards")
    ids = spec.steps * len(spec.layers) * spec.top_k
    if ids > MAX_SYNTH_IDS or spec.steps * spec.experts > MAX_SYNTH_KEYS:
        raise BadInput(
            f"{spec.steps:,} steps x {len(spec.layers)} layers x top-{spec.top_k} of {spec.experts} experts is "
            f"too large to synthesize (at most {MAX_SYNTH_IDS:,} ids and {MAX_SYNTH_KEYS:,} steps x experts)",
            fix="use fewer --steps",
        )
    rng = np.random.default_rng(spec.seed)
    routes = np.empty((spec.steps, len(spec.layers), spec.top_k), dtype=np.int16)
    skews = rng.uniform(spec.skew_min, spec.skew_max, size=len(spec.layers))
    steps = np.arange(spec.steps)
    for index, skew in enumerate(skews):
        popularity = np.arange(1, spec.experts + 1, dtype=np.float64) ** -skew
        weights = (popularity / popularity.sum())[rng.permutation(spec.experts)].astype(np.float32)
        # Exponential race (Gumbel-top-k): the top_k smallest Exp(1)/p are distinct draws by popularity.
        keys = rng.standard_exponential((spec.steps, spec.experts), dtype=np.float32) / weights[None, :]
        fresh = np.argpartition(keys, spec.top_k - 1, axis=1)[:, : spec.top_k].astype(np.int64)
        # A slot that repeats keeps the expert of the last step at which that slot drew fresh.
        repeat = rng.random((spec.steps, spec.top_k)) < spec.locality
        repeat[0] = False
        source = np.maximum.accumulate(np.where(repeat, 0, steps[:, None]), axis=0)
        layer_routes = fresh[source, np.arange(spec.top_k)[None, :]]
        routes[:, index, :] = _make_distinct(layer_routes, fresh)
    stationary = RoutingTrace(spec.layers, spec.experts, spec.top_k, routes)
    return drift_trace(stationary, spec.shifts, spec.seed) if spec.shifts else stationary


def _make_distinct(rows: NDArray[np.int64], fresh: NDArray[np.int64]) -> NDArray[np.int64]:
    """Replace repeated ids within a step by that step's own fresh draws (distinct by construction)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    rows = rows.copy()
    k = rows.shape[1]
    for _ in range(k):
        ordered = np.sort(rows, axis=1)
        dup_rows = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if dup_rows.size == 0:
            break
        sub = rows[dup_rows]
        # First slot whose id already appeared at an earlier slot of the same step.
        same = sub[:, :, None] == sub[:, None, :]
        earlier = np.tril(np.ones((k, k), dtype=bool), -1)
        slot = np.argmax((same & earlier[None]).any(axis=2), axis=1)
        # First fresh id of the step not present in the row.
        candidates = fresh[dup_rows]
        absent = ~(candidates[:, :, None] == sub[:, None, :]).any(axis=2)
        pick = candidates[np.arange(len(dup_rows)), np.argmax(absent, axis=1)]
        sub[np.arange(len(dup_rows)), slot] = pick
        rows[dup_rows] = sub
    return rows


def rank_experts(counts: NDArray[np.integer]) -> NDArray[np.int64]:
    """Hottest first; ties by expert id, so rankings are deterministic."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    order: NDArray[np.int64] = np.lexsort((np.arange(len(counts)), -np.asarray(counts))).astype(np.int64)
    return order


__all__ = [
    "COUNTS_FORMAT",
    "FORMAT_VERSION",
    "MAX_TRACE_BYTES",
    "TRACE_FORMAT",
    "RoutingCounts",
    "RoutingTrace",
    "SynthesizedTrace",
    "SyntheticTraceSpec",
    "drift_trace",
    "format_shifts",
    "parse_layers",
    "parse_shifts",
    "rank_experts",
    "read_counts",
    "read_routing_stats",
    "read_trace",
    "shift_permutations",
    "synthesize_trace",
    "write_counts",
    "write_trace",
]
