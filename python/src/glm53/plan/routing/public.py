"""`glm53 plan trace import`: public captures of a real MoE model's routing, into the trace format.

Two JSONL forms are read, told apart by their first record (`--format` forces one):

    expert-records   one record per token and layer, as published captures of Mixtral-8x7B's routing on
                     HumanEval and GSM8K are written:
                       {"dataset": "gsm8k", "problem_id": 0, "layer": 15, "token_idx": 42, "experts": [3, 7],
                        "gating_probs": [0.68, 0.32]}
                     ("token_pos" may stand for "token_idx"; "dataset" and "problem_id" are optional and name
                     the sequence; "gating_probs" and other fields are ignored)
    vllm-moe-log     a vLLM FusedMoE logging patch's form: a first record
                       {"type": "meta", "num_experts": 64, "top_k": 8, ...}
                     then {"type": "route", "req_id": "r0", "token_idx": 7, "layer": 0, "topk_ids": [...]}

A step is one token of one sequence: records are grouped by (sequence, token), sequences in the order they
first appear, tokens in index order; every step must have every layer the capture has, exactly once
(`drop_incomplete` drops the steps that do not, and says how many); `skip_steps` leaves out the first steps (a
capture's warm-up or profiling run). Expert ids are strict integers, distinct
within a record, below the expert count (the meta record's, `experts`, or else the largest id + 1, which the
result says was inferred). Every problem names its line.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from glm53.errors import BadInput
from glm53.fsutil import parse_json, read_bytes_bounded
from glm53.plan.routing.spec import MAX_EXPERTS
from glm53.plan.routing.traces import MAX_LAYER_ID, MAX_TRACE_BYTES, TRACE_FORMAT, RoutingTrace

if TYPE_CHECKING:
    pass

ImportFormat = Literal["expert-records", "vllm-moe-log"]
FormatChoice = Literal["auto", "expert-records", "vllm-moe-log"]
IMPORT_FORMATS: tuple[ImportFormat, ...] = ("expert-records", "vllm-moe-log")
_HINT = (
    'glm53 plan trace import reads expert-records JSONL ({"layer", "token_idx", "experts", ...} per line) '
    'and vllm-moe-log JSONL ({"type": "meta", ...} then {"type": "route", ...}); see docs/plan.md'
)


@dataclass(frozen=True)
class ImportedTrace:
    source_format: ImportFormat
    records: int
    sequences: int
    steps: int
    dropped_steps: int
    skipped_steps: int
    layers: list[int]
    experts: int
    experts_source: str
    top_k: int
    trace: RoutingTrace

    def summary(self) -> dict[str, Any]:
        """Everything but the routes, for --json."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trace"}


def _bad(path: Path, line: int, problem: str) -> BadInput:
    return BadInput(f"routing capture {path}, line {line}: {problem}", fix=_HINT)


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, raw in enumerate(io.BytesIO(data), start=1):
        if raw.strip():
            yield number, raw


def _integer(path: Path, line: int, record: dict[str, Any], key: str, *, low: int = 0, high: int | None = None) -> int:
    value = record.get(key)
    if type(value) is not int:  # bool is an int subclass: true is not 1 here
        raise _bad(path, line, f"{key} must be an integer, got {str(value)[:40]!r}")
    if value < low or (high is not None and value > high):
        raise _bad(path, line, f"{key} {value} is out of range")
    return value


def _ids(path: Path, line: int, record: dict[str, Any], key: str) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list) or not value:
        raise _bad(path, line, f"{key} must be a non-empty list of expert ids")
    for item in value:
        if type(item) is not int:
            raise _bad(path, line, f"expert id {str(item)[:40]!r} in {key} is not an integer")
        if not 0 <= item <= MAX_EXPERTS:
            raise _bad(path, line, f"expert id {item} in {key} is out of range")
    if len(set(value)) != len(value):
        raise _bad(path, line, f"{key} lists an expert twice: {value}")
    return value


def _sequence_name(path: Path, line: int, record: dict[str, Any], keys: tuple[str, ...]) -> str:
    parts = []
    for key in keys:
        if key in record:
            value = record[key]
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise _bad(path, line, f"{key} must be a string or an integer")
            parts.append(f"{key}={value}")
    return ",".join(parts)


def detect_format(path: Path, first: Any, line: int) -> ImportFormat:
    if isinstance(first, dict):
        if first.get("format") == TRACE_FORMAT:
            raise BadInput(f"{path} is already a glm53 routing trace: nothing to import", fix="use it as it is")
        if first.get("type") == "meta":
            return "vllm-moe-log"
        if "layer" in first and "experts" in first:
            return "expert-records"
    raise _bad(path, line, "neither an expert-records record nor a vllm-moe-log meta record")


def import_trace(
    path: Path,
    *,
    source_format: FormatChoice = "auto",
    experts: int | None = None,
    drop_incomplete: bool = False,
    skip_steps: int = 0,
) -> ImportedTrace:
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    path = Path(path)
    data = read_bytes_bounded(path, what="routing capture", max_bytes=MAX_TRACE_BYTES)
    lines = list(_lines(data))
    if not lines:
        raise BadInput(f"routing capture {path} is empty", fix=_HINT)

    def record_at(number: int, raw: bytes) -> dict[str, Any]:
        value = parse_json(raw, what=f"routing capture {path}, line {number}", fix=_HINT)
        if not isinstance(value, dict):
            raise _bad(path, number, "each line must be a JSON object")
        return value

    first_line, first_raw = lines[0]
    first = record_at(first_line, first_raw)
    chosen: ImportFormat = detect_format(path, first, first_line) if source_format == "auto" else source_format
    declared_experts: int | None = None
    body = lines
    if chosen == "vllm-moe-log":
        if first.get("type") != "meta":
            raise _bad(path, first_line, 'a vllm-moe-log starts with its {"type": "meta", ...} record')
        declared_experts = _integer(path, first_line, first, "num_experts", low=1, high=MAX_EXPERTS)
        _integer(path, first_line, first, "top_k", low=1, high=declared_experts)
        body = lines[1:]
    # (sequence, token) -> {layer: ids}; sequences in order of first appearance.
    steps: dict[tuple[int, int], dict[int, tuple[int, list[int]]]] = {}
    sequence_order: dict[str, int] = {}
    top_k: int | None = None
    largest = -1
    for number, raw in body:
        record = first if number == first_line else record_at(number, raw)
        if chosen == "vllm-moe-log":
            if record.get("type") != "route":
                if record.get("type") == "meta":
                    raise _bad(path, number, "a second meta record")
                continue  # other record types carry no routing
            sequence = _sequence_name(path, number, record, ("req_id",))
            ids = _ids(path, number, record, "topk_ids")
            token = _integer(path, number, record, "token_idx")
        else:
            sequence = _sequence_name(path, number, record, ("dataset", "problem_id"))
            ids = _ids(path, number, record, "experts")
            token_key = "token_idx" if "token_idx" in record else "token_pos"
            token = _integer(path, number, record, token_key)
        layer = _integer(path, number, record, "layer", high=MAX_LAYER_ID)
        if top_k is None:
            top_k = len(ids)
        elif len(ids) != top_k:
            raise _bad(path, number, f"{len(ids)} experts where earlier records have {top_k}")
        index = sequence_order.setdefault(sequence, len(sequence_order))
        step = steps.setdefault((index, token), {})
        if layer in step:
            raise _bad(path, number, f"layer {layer} of token {token} ({sequence or 'the sequence'}) appears twice")
        step[layer] = (number, ids)
        largest = max(largest, *ids)
    if top_k is None:
        raise BadInput(f"routing capture {path} has no routing records", fix=_HINT)
    count = experts if experts is not None else declared_experts
    experts_source = "given" if experts is not None else "the meta record" if declared_experts else "inferred"
    if count is None:
        count = largest + 1
    if largest >= count:
        line_of = next(number for step in steps.values() for number, ids in step.values() if max(ids) >= count)
        raise _bad(path, line_of, f"expert id {largest} is not below the expert count {count} ({experts_source})")
    if top_k > count:
        raise BadInput(f"routing capture {path}: top-{top_k} of only {count} experts", fix=_HINT)
    layers = sorted({layer for step in steps.values() for layer in step})
    complete = [key for key in sorted(steps) if len(steps[key]) == len(layers)]
    dropped = len(steps) - len(complete)
    if dropped and not drop_incomplete:
        key = next(key for key in sorted(steps) if len(steps[key]) != len(layers))
        missing = sorted(set(layers) - set(steps[key]))
        line_of = min(number for number, _ in steps[key].values())
        raise _bad(
            path,
            line_of,
            f"token {key[1]} of sequence {key[0] + 1} has no record for layer(s) {_short(missing)} "
            f"({dropped} of {len(steps)} steps are incomplete); --drop-incomplete leaves them out",
        )
    if skip_steps >= len(complete):
        raise BadInput(
            f"routing capture {path}: skipping {skip_steps:,} steps leaves none of its {len(complete):,}", fix=_HINT
        )
    complete = complete[skip_steps:]
    routes = np.array([[steps[key][layer][1] for layer in layers] for key in complete], dtype=np.int16)
    return ImportedTrace(
        source_format=chosen,
        records=sum(len(step) for step in steps.values()),
        sequences=len(sequence_order),
        steps=len(complete),
        dropped_steps=dropped,
        skipped_steps=skip_steps,
        layers=layers,
        experts=count,
        experts_source=experts_source,
        top_k=top_k,
        trace=RoutingTrace(tuple(layers), count, top_k, routes),
    )


def _short(values: list[int]) -> str:
    return ", ".join(map(str, values[:6])) + (f" and {len(values) - 6} more" if len(values) > 6 else "")


__all__ = ["IMPORT_FORMATS", "FormatChoice", "ImportFormat", "ImportedTrace", "detect_format", "import_trace"]
