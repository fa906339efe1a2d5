"""Trace and counts formats, readers' errors, and the synthetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from glm53.errors import BadInput
from glm53.plan.routing.traces import (
    RoutingTrace,
    SyntheticTraceSpec,
    read_counts,
    read_routing_stats,
    read_trace,
    synthesize_trace,
    write_counts,
    write_trace,
)

HEADER = {"format": "glm53-routing-trace", "version": 1, "layers": [3, 4], "experts": 4, "top_k": 2}


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_round_trip(tmp_path: Path) -> None:
    trace = synthesize_trace(SyntheticTraceSpec(layers=(3, 4, 5), experts=16, top_k=4, steps=50, seed=3))
    write_trace(tmp_path / "t.jsonl", trace)
    again = read_trace(tmp_path / "t.jsonl")
    assert again.layers == (3, 4, 5)
    assert (again.experts, again.top_k, again.steps) == (16, 4, 50)
    assert np.array_equal(again.routes, trace.routes)
    first = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[1])
    assert first["step"] == 0 and len(first["experts"]) == 3
    assert isinstance(read_routing_stats(tmp_path / "t.jsonl"), RoutingTrace)


def test_counts_round_trip(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [HEADER, {"step": 0, "experts": [[0, 1], [2, 3]]}, {"step": 1, "experts": [[1, 2], [3, 0]]}],
    )
    counts = read_trace(path).to_counts()
    assert counts.layers == {"3": [1, 2, 1, 0], "4": [1, 0, 1, 2]}
    assert counts.tokens == 2
    write_counts(tmp_path / "c.json", counts)
    assert read_counts(tmp_path / "c.json") == counts
    assert read_routing_stats(tmp_path / "c.json") == counts


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [
                {"format": "other", "version": 1, "layers": [3], "experts": 4, "top_k": 2},
                {"experts": [[0, 1]]},
            ],
            "line 1: format 'other'",
        ),
        ([HEADER, {"step": 0, "experts": [[0, 1], [2, 9]]}], "line 2: expert id 9 outside 0..3"),
        (
            [HEADER, {"step": 0, "experts": [[0, 1], [2, 3]]}, {"step": 1, "experts": [[1, 1], [2, 3]]}],
            "line 3: layer 3 lists an expert twice",
        ),
        ([HEADER, {"step": 0, "experts": [[0, 1, 2], [2, 3, 0]]}], "2 lists of 2 ids"),
        ([HEADER, "not an object"], "line 2"),
        ([HEADER], "no steps"),
    ],
)
def test_bad_traces_name_the_line(tmp_path: Path, lines: list[object], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        read_trace(_write(tmp_path / "bad.jsonl", lines))


def test_bad_counts(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "format": "glm53-routing-counts",
                "version": 1,
                "experts": 3,
                "tokens": 1,
                "layers": {"3": [1, 2]},
            }
        )
    )
    with pytest.raises(BadInput, match="layer 3 needs 3"):
        read_counts(path)


def test_synthetic_trace_is_top_k_distinct_and_local() -> None:
    local = synthesize_trace(SyntheticTraceSpec(layers=(3, 4), experts=64, top_k=8, steps=2000, locality=0.6))
    loose = synthesize_trace(SyntheticTraceSpec(layers=(3, 4), experts=64, top_k=8, steps=2000, locality=0.0))
    ordered = np.sort(local.routes, axis=2)
    assert not (ordered[:, :, 1:] == ordered[:, :, :-1]).any()
    assert local.routes.min() >= 0 and local.routes.max() < 64

    def reuse(trace: RoutingTrace) -> float:
        r = trace.routes[:, 0, :]
        return float(np.mean([len(set(r[i]) & set(r[i - 1])) for i in range(1, len(r))]))

    assert reuse(local) > reuse(loose) + 2.0
    again = synthesize_trace(SyntheticTraceSpec(layers=(3, 4), experts=64, top_k=8, steps=2000, locality=0.6))
    assert np.array_equal(local.routes, again.routes)  # seeded


def test_split_learns_first_part() -> None:
    trace = synthesize_trace(SyntheticTraceSpec(layers=(3,), experts=8, top_k=2, steps=10))
    learn, score = trace.split(0.2)
    assert (learn.steps, score.steps) == (2, 8)
    assert np.array_equal(score.routes, trace.routes[2:])
    with pytest.raises(BadInput):
        trace.split(1.0)


def test_binary_trace_round_trip_and_validation(tmp_path: Path) -> None:
    import io

    from glm53.plan.routing.traces import read_routing_stats, read_trace, write_trace

    trace = synthesize_trace(SyntheticTraceSpec(layers=(3, 4, 5), experts=16, top_k=4, steps=50))
    binary = tmp_path / "t.npz"
    write_trace(binary, trace)
    write_trace(tmp_path / "t.jsonl", trace)
    for path in (binary, tmp_path / "t.jsonl"):
        back = read_trace(path)
        assert (back.layers, back.experts, back.top_k) == (trace.layers, 16, 4)
        assert np.array_equal(back.routes, trace.routes)
    assert isinstance(read_routing_stats(binary), type(trace))
    assert binary.stat().st_size < (tmp_path / "t.jsonl").stat().st_size

    header = {"format": "glm53-routing-trace", "version": 1, "layers": [3, 4, 5], "experts": 16, "top_k": 4}

    def save(name: str, routes: object, head: dict[str, object] = header) -> Path:
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(head).encode(), np.uint8), routes=routes)
        (tmp_path / name).write_bytes(buffer.getvalue())
        return tmp_path / name

    bad_id = trace.routes.copy()
    bad_id[7, 1, 2] = 16
    twice = trace.routes.copy()
    twice[9, 2, 1] = twice[9, 2, 0]
    cases = {
        save("range.npz", bad_id): r"step 7, layer 4: expert id 16 outside 0\.\.15",
        save("twice.npz", twice): r"step 9: layer 5 lists an expert twice",
        save("shape.npz", trace.routes[:, :2]): r"shape \(steps >= 1, 3, 4\)",
        save("float.npz", trace.routes.astype(np.float32)): "must be integers",
        save("objects.npz", np.array([None, 1], dtype=object)): "not a readable numpy archive",
        save("header.npz", trace.routes, {**header, "top_k": 99}): "top_k 99 exceeds",
    }
    for path, message in cases.items():
        with pytest.raises(BadInput, match=message):
            read_trace(path)
