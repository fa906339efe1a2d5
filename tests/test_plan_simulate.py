"""Simulator and miss-ratio curves against hand-computed traces and a plain reference cache."""

from __future__ import annotations

import numpy as np
import pytest

from glm53.plan.cache.hit_curves import default_pinned_grid, layer_curves, stack_distances
from glm53.plan.cache.replay import belady_hits, pinned_lru_hits
from glm53.plan.routing.traces import rank_experts

# Four steps of two accesses over experts 0..3 (worked through in docs/plan.md).
HAND = np.array([[0, 1], [2, 0], [1, 3], [0, 2]])
IDENTITY = np.arange(4)


def reference_pinned_lru(routes: np.ndarray, pinned: set[int], window: int) -> int:
    """The step model spelled out: look up, then keep the `window` most recent unpinned experts."""
    recency: dict[int, int] = {}
    resident: set[int] = set()
    hits = 0
    for step, row in enumerate(routes.tolist()):
        for position, expert in enumerate(row):
            if expert in pinned or expert in resident:
                hits += 1
            if expert not in pinned:
                recency[expert] = step * len(row) + position
        newest = sorted(recency, key=recency.__getitem__, reverse=True)[:window]
        resident = set(newest)
    return hits


def test_hand_computed_lru_hits() -> None:
    assert [pinned_lru_hits(HAND, 4, IDENTITY, [(0, w)])[0] for w in range(5)] == [0, 0, 1, 3, 4]
    # Expert 0 pinned (3 hits, loaded up front), one or two LRU slots for the rest.
    assert pinned_lru_hits(HAND, 4, IDENTITY, [(1, 1), (1, 2)]) == [3, 4]


def test_hand_computed_stack_distances() -> None:
    distances = stack_distances(HAND, 4)
    assert distances.tolist() == [[4, 4], [4, 1], [2, 4], [2, 3]]  # 4 = first use (cold)


def test_hand_computed_belady() -> None:
    # Warm start: the cache begins with the experts needed first (0, then 1, then 2, then 3).
    assert [belady_hits(HAND, capacity, 4) for capacity in (1, 2, 3, 4)] == [3, 5, 7, 8]


def test_curves_match_the_reference_cache() -> None:
    rng = np.random.default_rng(7)
    experts = 12
    routes = np.stack(
        [rng.choice(experts, size=3, replace=False, p=np.linspace(3, 1, experts) / 24) for _ in range(120)]
    )
    counts = np.bincount(routes.ravel(), minlength=experts)
    ranking = rank_experts(counts)
    curves = layer_curves(routes, experts, ranking)  # every pinned count
    for pinned in range(experts + 1):
        for window in range(experts + 1 - pinned):
            expected = reference_pinned_lru(routes, set(ranking[:pinned].tolist()), window)
            assert curves.hits[pinned, window] == expected, (pinned, window)
    simulated = pinned_lru_hits(routes, experts, ranking, [(2, 3), (0, 5), (5, 0)])
    assert simulated == [curves.hits[2, 3], curves.hits[0, 5], curves.hits[5, 0]]
    for capacity in range(experts + 1):
        pinned = int(curves.best_pinned[capacity])
        assert curves.best[capacity] == curves.hits[pinned, capacity - pinned]
        assert curves.best[capacity] == max(curves.hits[p, capacity - p] for p in range(capacity + 1))
        # MIN is an upper bound for every split with the same slots.
        assert belady_hits(routes, capacity, experts) >= curves.best[capacity]


def test_grid_curves_agree_with_exact_on_grid_points() -> None:
    rng = np.random.default_rng(1)
    experts = 40
    routes = np.stack([rng.choice(experts, size=4, replace=False) for _ in range(200)])
    ranking = rank_experts(np.bincount(routes.ravel(), minlength=experts))
    exact = layer_curves(routes, experts, ranking)
    grid = default_pinned_grid(experts)
    coarse = layer_curves(routes, experts, ranking, grid)
    assert np.array_equal(coarse.hits, exact.hits[grid])
    assert np.all(coarse.best <= exact.best)


def test_grid_must_start_at_zero() -> None:
    with pytest.raises(ValueError, match="pinned_grid"):
        layer_curves(HAND, 4, IDENTITY, np.array([1, 2]))


def test_comparison_is_the_same_on_one_or_two_processes() -> None:
    from glm53.plan.cache.compare import compare_policies
    from glm53.plan.routing.traces import SyntheticTraceSpec, synthesize_trace

    trace = synthesize_trace(SyntheticTraceSpec(layers=(3, 4, 5), experts=32, top_k=4, steps=300, seed=2))
    one = compare_policies(trace, (0.25, 0.5), workers=1)
    two = compare_policies(trace, (0.25, 0.5), workers=2)
    assert [[r.hits for r in b.results] for b in one.budgets] == [[r.hits for r in b.results] for b in two.budgets]
    for budget in one.budgets:
        hits = {r.policy: r.hits for r in budget.results}
        assert hits["d"] >= hits["c"]
        assert sum(budget.slots_per_layer_planned) == budget.slots
