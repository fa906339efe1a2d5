"""The engines' policies against literal transcriptions of their rules, and the decayed-frequency cache's two
implementations against each other and a plain reference."""

from __future__ import annotations

import numpy as np
import pytest

from glm53.plan.cache import policies
from glm53.plan.cache.policies import (
    _sweep_points,
    adaptive_frequency,
    decayed_frequency,
    exl3_dynamic,
    exl3_static,
    pinned_lru_step_hits,
    static_cpu_mask,
)
from glm53.plan.cache.replay import pinned_lru_hits
from glm53.plan.exllamav3.split import static_cpu_experts
from glm53.plan.routing.traces import SyntheticTraceSpec, synthesize_trace

SMALL = SyntheticTraceSpec(layers=(3, 4, 5), experts=40, top_k=4, steps=900, seed=1, skew_min=0.8, skew_max=1.4)


def engine_sweep(hist: list[float], mapping: list[int], first: int, budget: int, hyst: float, floor_x: float) -> int:
    """BlockSparseMLP_CPU._split_sweep_layer (block_sparse_mlp_cpu.py at 499890c), line for line, on lists."""
    experts = len(hist)
    floor = floor_x * sum(hist) / experts
    head = [(hist[r], r) for r in range(experts) if mapping[r] < first]
    tail = [(hist[r], r) for r in range(experts) if mapping[r] >= first]
    head.sort()
    tail.sort(reverse=True)
    swaps = 0
    for (c_cold, r_cold), (c_hot, r_hot) in zip(head, tail, strict=False):
        if swaps >= budget or c_hot < max(hyst * max(c_cold, 1.0), floor):
            break
        slot = mapping[r_cold]
        mapping[r_cold], mapping[r_hot] = mapping[r_hot], slot
        swaps += 1
    for r in range(experts):
        hist[r] *= 0.5
    return swaps


def engine_replay(
    routes: np.ndarray,
    experts: int,
    k: int,
    interval: int,
    hyst: float,
    floor_x: float,
    cap: int,
    generation: int | None,
) -> tuple[np.ndarray, int]:
    """The engine's tick (_split_swap_tick), pending sweep and registry walk (run_pending_swap_sweeps)."""
    steps, layers, _ = routes.shape
    mappings = [list(range(experts)) for _ in range(layers)]
    hists = [[0.0] * experts for _ in range(layers)]
    first = experts - k
    tick, pending, swaps = 0, False, 0
    on_gpu = np.zeros((steps, layers), dtype=np.int64)

    def sweep() -> int:
        budget, total = cap, 0
        for layer in range(layers):
            if budget <= 0:
                break
            made = engine_sweep(hists[layer], mappings[layer], first, budget, hyst, floor_x)
            budget -= made
            total += made
        return total

    for step in range(steps):
        tick += 1
        if tick >= interval:
            pending = True
            if tick >= 4 * interval:
                swaps += sweep()
                tick, pending = 0, False
        for layer in range(layers):
            for expert in routes[step, layer].tolist():
                hists[layer][expert] += 1.0
                on_gpu[step, layer] += mappings[layer][expert] < first
        if pending and (generation is None or (step + 1) % generation == 0):
            swaps += sweep()
            tick, pending = 0, False
    return on_gpu, swaps


@pytest.mark.parametrize(
    ("interval", "hyst", "floor_x", "cap", "generation"),
    [(8, 2.0, 0.0, 64, None), (5, 1.5, 2.0, 3, None), (4, 2.0, 0.0, 64, 50), (16, 1.0, 1.0, 5, 7)],
)
def test_dynamic_split_matches_the_engines_rule(
    interval: int, hyst: float, floor_x: float, cap: int, generation: int | None
) -> None:
    trace = synthesize_trace(SMALL)
    expected, swaps = engine_replay(trace.routes, 40, 30, interval, hyst, floor_x, cap, generation)
    got = exl3_dynamic(
        trace.routes,
        40,
        [30] * 3,
        interval=interval,
        hysteresis=hyst,
        floor=floor_x,
        max_swaps=cap,
        generation=generation,
    )
    assert np.array_equal(got.hits, expected)
    assert got.swaps_between(0) == swaps > 0
    assert got.sweep_steps is not None and got.sweeps_between(0) == len(got.sweep_steps)


def test_a_sweep_gives_each_split_layer_a_turn_until_the_swap_cap_is_spent() -> None:
    """`run_pending_swap_sweeps` stops at the layer that spends the cap: the later layers get no turn, which is
    what a sweep's cost counts (`StepCost.turn_seconds`); a layer without a split never has one."""
    trace = synthesize_trace(SMALL)
    split = [30, 0, 30]
    free = exl3_dynamic(trace.routes, 40, split, interval=4, hysteresis=1.0, floor=0.0, max_swaps=10_000)
    assert free.turns is not None and set(free.turns.tolist()) == {2}
    assert free.turns_between(0) == 2 * free.sweeps_between(0)
    capped = exl3_dynamic(trace.routes, 40, split, interval=4, hysteresis=1.0, floor=0.0, max_swaps=1)
    assert capped.turns is not None and capped.swaps is not None
    assert np.all(capped.turns[capped.swaps == 1] == 1)  # the first layer spent the cap: the second had no turn
    # from a step on: only the sweeps after it
    middle = int(capped.sweep_steps[len(capped.sweep_steps) // 2]) if capped.sweep_steps is not None else 0
    assert capped.sweeps_between(middle) == int((capped.sweep_steps >= middle).sum())


def test_sweep_points() -> None:
    # Drained after every step: a sweep every `interval` steps.
    assert _sweep_points(7, 3, None) == [(3, False), (6, False)]
    # One long generation: inline once the ticks reach 4 x interval, before that step routes.
    assert _sweep_points(17, 2, 100) == [(7, True), (15, True)]
    # Generations of 5: the pending sweep waits for the queue to drain after the generation's last step.
    assert _sweep_points(12, 2, 5) == [(5, False), (10, False)]


def test_static_split_is_the_engines_tail() -> None:
    counts = np.array([[5, 1, 1, 9, 0, 1], [0, 0, 0, 0, 0, 0]])
    mask = static_cpu_mask(counts, np.array([3, 2]))
    for layer in range(2):
        assert sorted(np.flatnonzero(mask[layer]).tolist()) == sorted(static_cpu_experts(counts[layer], [3, 2][layer]))
    routes = np.array([[[3, 0], [0, 1]], [[4, 2], [5, 4]]])
    assert exl3_static(routes, 6, mask).hits.tolist() == [[2, 2], [0, 0]]


def test_pinned_lru_step_hits_sum_to_the_one_pass_totals() -> None:
    trace = synthesize_trace(SMALL)
    rankings = np.stack([np.argsort(-np.bincount(trace.routes[:, i].ravel(), minlength=40)) for i in range(3)])
    got = pinned_lru_step_hits(trace.routes, 40, rankings, [2, 0, 5], [6, 9, 1])
    for index, (pinned, window) in enumerate([(2, 6), (0, 9), (5, 1)]):
        expected = pinned_lru_hits(trace.routes[:, index], 40, rankings[index], [(pinned, window)])[0]
        assert int(got.hits[:, index].sum()) == expected


def reference_frequency(routes: np.ndarray, experts: int, capacity: int, recent: int, half_life: float) -> int:
    """The rule in words: count every use, decay by half every `half_life` steps; after a step keep the last
    `recent` steps' experts, then the highest counts (ties: less recent first out, then lower id)."""
    score = np.zeros(experts)
    last = np.full(experts, -(10**9))
    resident: set[int] = set()
    hits = 0
    for step, ids in enumerate(routes.tolist()):
        hits += sum(e in resident for e in ids)
        score *= 0.5 ** (1 / half_life)
        for e in ids:
            score[e] += 1
            last[e] = step
        resident |= set(ids)
        ranked = sorted(resident, key=lambda e: (last[e] > step - recent, score[e], last[e], e), reverse=True)
        resident = set(ranked[:capacity])
    return hits


def test_decayed_frequency_loop_numpy_and_reference_agree() -> None:
    trace = synthesize_trace(SMALL)
    for capacity, recent, half_life in [(8, 1, 16.0), (12, 2, 64.0), (5, 1, 8.0)]:
        slots = [capacity, capacity + 2, capacity]
        loop = decayed_frequency(trace.routes, 40, slots, recent=recent, half_life=half_life, loop=True)
        vectorised = decayed_frequency(trace.routes, 40, slots, recent=recent, half_life=half_life, loop=False)
        assert np.array_equal(loop.hits, vectorised.hits)
        reference = reference_frequency(trace.routes[:, 1], 40, capacity + 2, recent, half_life)
        assert abs(int(loop.hits[:, 1].sum()) - reference) <= 2  # float decay order: ties may fall apart


def test_adaptive_frequency_with_one_half_life_is_the_plain_cache() -> None:
    trace = synthesize_trace(SMALL)
    plain = decayed_frequency(trace.routes, 40, 10, half_life=64.0, loop=True)
    tuned = adaptive_frequency(trace.routes, 40, 10, half_lives=(64.0,))
    assert np.array_equal(plain.hits, tuned.hits)
    several = adaptive_frequency(trace.routes, 40, 10, half_lives=(8.0, 64.0, 512.0))
    assert 0 < several.total() <= trace.routes[:, :, :].size


def test_the_loop_runs_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = synthesize_trace(SyntheticTraceSpec(layers=(3,), experts=16, top_k=2, steps=200, seed=4))
    compiled = adaptive_frequency(trace.routes, 16, 4, half_lives=(8.0, 32.0))
    monkeypatch.setattr(policies, "_KERNEL", [policies._frequency_loop])
    assert not policies.compiled()
    assert np.array_equal(adaptive_frequency(trace.routes, 16, 4, half_lives=(8.0, 32.0)).hits, compiled.hits)
