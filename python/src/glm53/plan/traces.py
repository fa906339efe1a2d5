"""Routing statistics: the trace and counts file formats, their readers and writers, and a synthetic
generator.

Trace (JSONL, one JSON object per line):
    line 1  {"format": "glm53-routing-trace", "version": 1, "layers": [3, ..., 44],
             "experts": 288, "top_k": 8}
    then    {"step": 0, "experts": [[e, ...top_k ids], ... one list per layer, in header order]}
One line per decode step (one token of one sequence). Within a layer's list the ids are distinct, in the
router's order (highest score first); the simulator takes them in that order.

Counts (JSON): {"format": "glm53-routing-counts", "version": 1, "experts": 288, "tokens": N,
                "layers": {"3": [count of expert 0, count of expert 1, ...], ...}}
Counts carry popularity only (no order in time), so they can rank experts but cannot size an LRU window.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import atomic_write_bytes, atomic_write_json, read_json
from glm53.host.topology import parse_cpu_list

TRACE_FORMAT = "glm53-routing-trace"
COUNTS_FORMAT = "glm53-routing-counts"
FORMAT_VERSION = 1


class TraceHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    version: int
    layers: list[int] = Field(min_length=1)
    experts: int = Field(gt=0, le=32767)
    top_k: int = Field(gt=0)


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
    model_config = ConfigDict(extra="forbid")

    format: str = COUNTS_FORMAT
    version: int = FORMAT_VERSION
    experts: int = Field(gt=0)
    tokens: int = Field(ge=0)
    layers: dict[str, list[int]]

    def matrix(self, layers: Sequence[int]) -> NDArray[np.int64]:
        out = np.zeros((len(layers), self.experts), dtype=np.int64)
        for i, layer in enumerate(layers):
            if str(layer) in self.layers:
                out[i] = self.layers[str(layer)]
        return out


def _bad_trace(path: Path, line: int, problem: str) -> BadInput:
    return BadInput(
        f"routing trace {path}, line {line}: {problem}",
        hint="see docs/plan.md for the trace format; `glm53 plan trace synth` writes a valid one",
    )


def read_trace(path: Path) -> RoutingTrace:
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError as exc:
        raise BadInput(f"routing trace not found: {path}") from exc
    except OSError as exc:
        raise BadInput(f"cannot read routing trace {path}: {exc.strerror}") from exc
    with handle:
        first = handle.readline()
        try:
            header = TraceHeader.model_validate_json(first)
        except ValidationError as exc:
            raise _bad_trace(path, 1, f"not a trace header ({exc.errors()[0]['msg']})") from exc
        if header.format != TRACE_FORMAT or header.version != FORMAT_VERSION:
            raise _bad_trace(
                path,
                1,
                f"format {header.format!r} version {header.version} is not {TRACE_FORMAT!r} version {FORMAT_VERSION}",
            )
        rows: list[list[list[int]]] = []
        for number, raw in enumerate(handle, start=2):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                experts = record["experts"]
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                raise _bad_trace(path, number, 'expected {"step": N, "experts": [[...], ...]}') from exc
            rows.append(experts)
    if not rows:
        raise _bad_trace(path, 1, "the trace has a header but no steps")
    try:
        routes = np.asarray(rows, dtype=np.int64)
    except (ValueError, TypeError) as exc:
        raise _bad_trace(path, 2, "every step needs one list of top_k ids per layer") from exc
    return _validated(path, header, routes)


def _validated(path: Path, header: TraceHeader, routes: NDArray[np.int64]) -> RoutingTrace:
    shape = (len(header.layers), header.top_k)
    if routes.ndim != 3 or routes.shape[1:] != shape:
        raise _bad_trace(
            path, 2, f"steps must hold {shape[0]} lists of {shape[1]} ids, got shape {list(routes.shape[1:])}"
        )
    bad = np.argwhere((routes < 0) | (routes >= header.experts))
    if bad.size:
        step = int(bad[0][0])
        raise _bad_trace(path, step + 2, f"expert id {int(routes[tuple(bad[0])])} outside 0..{header.experts - 1}")
    ordered = np.sort(routes, axis=2)
    dup = np.argwhere(ordered[:, :, 1:] == ordered[:, :, :-1])
    if dup.size:
        step, layer = int(dup[0][0]), header.layers[int(dup[0][1])]
        raise _bad_trace(path, step + 2, f"layer {layer} lists an expert twice")
    return RoutingTrace(tuple(header.layers), header.experts, header.top_k, routes.astype(np.int16))


def write_trace(path: Path, trace: RoutingTrace) -> None:
    header = {
        "format": TRACE_FORMAT,
        "version": FORMAT_VERSION,
        "layers": list(trace.layers),
        "experts": trace.experts,
        "top_k": trace.top_k,
    }
    lines = [json.dumps(header)]
    for step, row in enumerate(trace.routes.tolist()):
        lines.append(json.dumps({"step": step, "experts": row}, separators=(",", ":")))
    atomic_write_bytes(Path(path), ("\n".join(lines) + "\n").encode())


def read_counts(path: Path) -> RoutingCounts:
    raw = read_json(path, what="routing counts")
    try:
        counts = RoutingCounts.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, f"routing counts {path}", hint="see docs/plan.md for the counts format") from exc
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
    try:
        with Path(path).open("rb") as handle:
            first = handle.readline(1 << 20)
    except FileNotFoundError as exc:
        raise BadInput(f"routing statistics not found: {path}") from exc
    except OSError as exc:
        raise BadInput(f"cannot read routing statistics {path}: {exc.strerror}") from exc
    if TRACE_FORMAT.encode() in first:
        return read_trace(path)
    return read_counts(path)


# --- synthetic traces ---------------------------------------------------------------------------------------


class SyntheticTraceSpec(BaseModel):
    """Per-layer Zipf popularity (skew drawn per layer from [skew_min, skew_max]) and temporal locality: each
    of a step's top_k slots repeats the previous step's expert in that slot with probability `locality`."""

    model_config = ConfigDict(frozen=True)

    layers: tuple[int, ...] = tuple(range(3, 45))
    experts: int = Field(default=288, gt=0, le=32767)
    top_k: int = Field(default=8, gt=0)
    steps: int = Field(default=20_000, gt=1)
    locality: float = Field(default=0.3, ge=0.0, lt=1.0)
    skew_min: float = Field(default=0.4, ge=0.0)
    skew_max: float = Field(default=1.2, ge=0.0)
    seed: int = 0


def parse_layers(text: str, *, flag: str = "--layers") -> tuple[int, ...]:
    """MoE layer ids in the kernel's list format, e.g. 3-44 or 3,5,7-9."""
    layers = parse_cpu_list(text, what=flag)
    if not layers:
        raise BadInput(f"{flag} is empty", hint=f"e.g. {flag} 3-44")
    return layers


def synthesize_trace(spec: SyntheticTraceSpec) -> RoutingTrace:
    if spec.top_k > spec.experts:
        raise BadInput(f"top_k {spec.top_k} exceeds the {spec.experts} experts")
    if spec.skew_max < spec.skew_min:
        raise BadInput(f"skew range [{spec.skew_min}, {spec.skew_max}] runs backwards")
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
    return RoutingTrace(spec.layers, spec.experts, spec.top_k, routes)


def _make_distinct(rows: NDArray[np.int64], fresh: NDArray[np.int64]) -> NDArray[np.int64]:
    """Replace repeated ids within a step by that step's own fresh draws (distinct by construction)."""
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


__all__ = [
    "COUNTS_FORMAT",
    "FORMAT_VERSION",
    "TRACE_FORMAT",
    "RoutingCounts",
    "RoutingTrace",
    "SyntheticTraceSpec",
    "parse_layers",
    "read_counts",
    "read_routing_stats",
    "read_trace",
    "synthesize_trace",
    "write_counts",
    "write_trace",
]
