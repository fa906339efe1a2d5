"""Drift: synthetic popularity shifts, the hedged pinned/window split, and `plan simulate`'s drift scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from glm53.errors import BadInput
from glm53.plan.cache.compare import compare_policies
from glm53.plan.cache.hit_curves import default_pinned_grid, layer_curves
from glm53.plan.cache.slots import cross_fitted_hits, drift_case, hedged_split, learn_from_trace
from glm53.plan.routing.traces import SyntheticTraceSpec, drift_trace, parse_shifts, rank_experts, synthesize_trace

SMALL = {"layers": tuple(range(6)), "experts": 64, "top_k": 4, "steps": 2500}


def test_shift_relabels_from_its_step_on_and_keeps_the_rest() -> None:
    base = synthesize_trace(SyntheticTraceSpec(**SMALL, seed=3))
    shifted = synthesize_trace(SyntheticTraceSpec(**SMALL, seed=3, shifts=((0.5, 1.0),)))
    cut = 1250
    assert np.array_equal(base.routes[:cut], shifted.routes[:cut])
    assert not np.array_equal(base.routes[cut:], shifted.routes[cut:])
    # A relabelling per layer: the same expert always maps to the same new one, so each layer's counts are the
    # same multiset, only on other experts.
    for layer in range(len(base.layers)):
        before = np.bincount(base.routes[cut:, layer].ravel(), minlength=64)
        after = np.bincount(shifted.routes[cut:, layer].ravel(), minlength=64)
        assert sorted(before.tolist()) == sorted(after.tolist())
    assert np.array_equal(drift_trace(base, [(0.5, 0.0)]).routes, base.routes)  # strength 0 moves nothing


def test_partial_strength_moves_about_that_share() -> None:
    base = synthesize_trace(SyntheticTraceSpec(**SMALL))
    moved = drift_trace(base, [(0.2, 0.25)], seed=1)
    changed = (moved.routes[600:] != base.routes[600:]).mean()
    assert 0.1 < changed < 0.35


def test_parse_shifts() -> None:
    assert parse_shifts("0.5:1,0.15:0.5") == ((0.5, 1.0), (0.15, 0.5))
    assert parse_shifts("0.5") == ((0.5, 1.0),)
    assert parse_shifts("none") == ()
    for bad in ("1.5:1", "0.5:2", "half:1"):
        with pytest.raises(BadInput):
            parse_shifts(bad)


def test_cross_fitted_curves_score_each_half_with_the_other_halfs_ranking() -> None:
    half = synthesize_trace(SyntheticTraceSpec(**SMALL, seed=5)).routes[:600, 0, :]
    grid = default_pinned_grid(64)
    # Two equal halves: each is scored with its own ranking, so the curves are twice the half's in-sample ones.
    own = layer_curves(half, 64, rank_experts(np.bincount(half.ravel(), minlength=64)), grid).hits
    doubled = cross_fitted_hits(np.concatenate([half, half]), 64, grid)
    assert np.array_equal(doubled, np.where(own < 0, -1, 2 * own))
    # Different halves: a pin is worth no more than in-sample, where the ranking is fitted to the very draws.
    routes = synthesize_trace(SyntheticTraceSpec(**SMALL, seed=5)).routes[:1200, 0, :]
    in_sample = layer_curves(routes, 64, rank_experts(np.bincount(routes.ravel(), minlength=64)), grid).hits
    crossed = cross_fitted_hits(routes, 64, grid)
    assert crossed[grid == 16, 0][0] <= in_sample[grid == 16, 0][0]


def test_hedge_trades_a_little_learned_gain_for_the_drift_case() -> None:
    trace = synthesize_trace(SyntheticTraceSpec(**SMALL, locality=0.3))
    learn, _ = trace.split(0.4)
    _, curves = learn_from_trace(learn, workers=1)
    budget = round(0.17 * 6 * 64)
    plain, plain_facts = hedged_split(curves, budget, min_slots=4, hedged=False)
    hedged, facts = hedged_split(curves, budget, min_slots=4)
    assert plain_facts.weight == 0.0 and facts.weight > 0.0
    assert sum(p for p, _ in hedged) < sum(p for p, _ in plain)  # fewer pinned
    plain_drift = sum(drift_case(c, p, w) for c, (p, w) in zip(curves, plain, strict=True))
    assert facts.drift_hits > plain_drift
    assert facts.stationary_hits <= facts.unhedged_hits
    assert facts.stationary_hits >= 0.9 * facts.unhedged_hits  # most of the learned hits are kept
    # The guard: a zero tolerance keeps the drift case at the recipe's.
    _, strict = hedged_split(curves, budget, min_slots=4, tolerance=0.0)
    assert strict.drift_hits >= strict.recipe_drift_hits - 1e-9


def test_simulate_reports_worst_drift_beside_the_stationary_gain() -> None:
    trace = synthesize_trace(SyntheticTraceSpec(**SMALL, locality=0.5))
    report = compare_policies(trace, (0.17, 0.33), workers=1, drift=((0.5, 1.0), (0.1, 1.0)))
    assert report.drift_scenarios == [(0.5, 1.0), (0.1, 1.0)]
    for budget in report.budgets:
        assert [(d.at, d.strength) for d in budget.drift] == [(0.5, 1.0), (0.1, 1.0)]
        assert budget.worst_drift_gain == min(d.gain for d in budget.drift)
        for d in budget.drift:
            assert 0.0 < d.recipe_hit_rate < 1.0 and 0.0 < d.planned_hit_rate < 1.0
        # Full re-permutation at mid-trace: the hedged plan stays near the recipe (a small, noisy trace; the
        # full-size targets are measured by benchmarks/bench_plan_drift.py).
        assert budget.drift[0].gain >= -0.025
    assert compare_policies(trace, (0.17,), workers=1).budgets[0].worst_drift_gain is None


def test_cli_synth_shift_and_simulate_drift_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_plan_cli import run

    trace = tmp_path / "d.jsonl"
    synth = ["plan", "trace", "synth", "--out", str(trace), "--steps", "400", "--layers", "3-6"]
    code, _, _ = run([*synth, "--experts", "32", "--top-k", "4", "--shift", "0.5:1"], capsys, monkeypatch)
    assert code == 0
    simulate = ["plan", "simulate", str(trace), "--budgets", "0.25,0.5", "--workers", "1"]
    code, out, _ = run([*simulate, "--drift", "0.5:1,0.1:0.5"], capsys, monkeypatch)
    assert code == 0
    assert "Drift: planned (c) minus recipe (b)" in out and "shift 50% at 10%" in out
    code, out, _ = run([*simulate, "--drift", "none", "--json"], capsys, monkeypatch)
    assert code == 0
    report = json.loads(out)
    assert report["drift_scenarios"] == [] and all(b["drift"] == [] for b in report["budgets"])
    code, _, err = run([*simulate, "--drift", "0.5:3"], capsys, monkeypatch)
    assert code == 2 and "--drift" in err
    code, _, err = run([*synth, "--force", "--shift", "x"], capsys, monkeypatch)
    assert code == 2 and "--shift" in err
