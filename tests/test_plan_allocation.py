"""Exact slot allocation across layers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from glm53.errors import BadInput
from glm53.plan.cache.allocation import allocate_slots, uniform_split


def test_dp_does_not_starve_a_non_concave_layer() -> None:
    # Layer A pays only from 3 slots on; marginal-gain greedy would give every slot to B (total 10).
    layer_a = np.array([0, 0, 0, 10, 10])
    layer_b = np.array([0, 4, 7, 9, 10])
    assert allocate_slots([layer_a, layer_b], 4) == [3, 1]


def test_dp_matches_brute_force() -> None:
    rng = np.random.default_rng(5)
    curves = [np.concatenate([[0], np.cumsum(rng.integers(0, 9, size=6))]) for _ in range(4)]
    for budget in range(0, 25, 3):
        split = allocate_slots(curves, budget, min_slots=1) if budget >= 4 else None
        if split is None:
            continue
        best = max(
            sum(int(c[s]) for c, s in zip(curves, combo, strict=True))
            for combo in itertools.product(range(1, 7), repeat=4)
            if sum(combo) == min(budget, 24)
        )
        assert sum(int(c[s]) for c, s in zip(curves, split, strict=True)) == best
        assert sum(split) == min(budget, 24)
        assert min(split) >= 1


def test_minimum_slots_enforced() -> None:
    with pytest.raises(BadInput, match="cannot give 2 layers 8 slots each") as info:
        allocate_slots([np.arange(10)] * 2, 15, min_slots=8)
    assert info.value.fix == "it needs at least 16 slots"


def test_uniform_split_spreads_the_remainder() -> None:
    assert uniform_split(10, 4, 288) == [3, 3, 2, 2]
    assert uniform_split(10_000, 2, 288) == [288, 288]
