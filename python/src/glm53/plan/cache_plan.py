"""The GPU expert-cache plan: slots per layer, and per layer how many hold pinned hot experts vs an LRU
window.

From a routing trace: rankings and hit curves learned on the first part, the slot budget split across layers
by exact DP over the learned curves, each layer's pinned/window split the best for its slots, and the result
scored on the held-out rest. From counts only: popularity without time order, under which pinning the hottest
is the best a cache can do, so every slot is pinned. Without statistics: layers are indistinguishable, so the
principled default is the same slots for every layer, all of them LRU (with no ranking there is nothing to
pin).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.plan.allocation import allocate_slots, uniform_split
from glm53.plan.miss_ratio import LayerCurves, default_pinned_grid, layer_curves, rank_experts
from glm53.plan.parallel import default_workers, layer_map
from glm53.plan.simulate import pinned_lru_hits
from glm53.plan.traces import RoutingCounts, RoutingTrace

Strategy = Literal["trace", "counts", "uniform-lru"]


class LayerCache(BaseModel):
    model_config = ConfigDict(frozen=True)

    layer: int
    slots: int
    pinned: int
    window: int
    learned_hit_rate: float | None = None
    scored_hit_rate: float | None = None


class CachePlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    strategy: Strategy
    source: str
    total_slots: int
    layers: list[LayerCache]
    learned_steps: int = 0
    scored_steps: int = 0
    expected_hit_rate: float | None  # held-out when a trace was split, else in-sample, None without statistics
    hit_rate_basis: str
    rankings: dict[str, list[int]] | None = None

    @property
    def pinned_fraction(self) -> float:
        total = sum(layer.slots for layer in self.layers)
        return sum(layer.pinned for layer in self.layers) / total if total else 0.0


def _check_layers(
    stats_layers: tuple[int, ...] | list[int],
    experts: int,
    moe_layers: tuple[int, ...],
    n_experts: int,
    what: str,
) -> None:
    if tuple(stats_layers) != tuple(moe_layers):
        raise BadInput(
            f"{what} covers layers {_short(stats_layers)}, the model's MoE layers are {_short(moe_layers)}",
            hint="record the statistics with this model",
        )
    if experts != n_experts:
        raise BadInput(f"{what} has {experts} experts per layer, the model has {n_experts}")


def _short(layers: tuple[int, ...] | list[int]) -> str:
    items = list(layers)
    return f"{items[0]}..{items[-1]} ({len(items)})" if len(items) > 4 else str(items)


def uniform_lru_plan(moe_layers: tuple[int, ...], experts: int, budget: int) -> CachePlan:
    slots = uniform_split(budget, len(moe_layers), experts)
    return CachePlan(
        strategy="uniform-lru",
        source="no routing statistics",
        total_slots=sum(slots),
        layers=[
            LayerCache(layer=layer, slots=s, pinned=0, window=s) for layer, s in zip(moe_layers, slots, strict=True)
        ],
        expected_hit_rate=None,
        hit_rate_basis="no statistics to predict from",
    )


def counts_plan(
    counts: RoutingCounts,
    moe_layers: tuple[int, ...],
    experts: int,
    budget: int,
    *,
    min_slots: int,
    source: str,
) -> CachePlan:
    layer_keys = [int(k) for k in counts.layers]
    _check_layers(sorted(layer_keys), counts.experts, moe_layers, experts, f"routing counts {source}")
    matrix = counts.matrix(moe_layers)
    rankings = [rank_experts(row) for row in matrix]
    curves = [np.concatenate([[0], np.cumsum(row[ranking])]) for row, ranking in zip(matrix, rankings, strict=True)]
    slots = allocate_slots(curves, budget, min_slots=min_slots)
    totals = matrix.sum(axis=1)
    layers = [
        LayerCache(
            layer=layer,
            slots=s,
            pinned=s,
            window=0,
            learned_hit_rate=float(curve[s] / total) if total else None,
        )
        for layer, s, curve, total in zip(moe_layers, slots, curves, totals, strict=True)
    ]
    hits = sum(int(curve[s]) for curve, s in zip(curves, slots, strict=True))
    return CachePlan(
        strategy="counts",
        source=source,
        total_slots=sum(slots),
        layers=layers,
        expected_hit_rate=hits / max(1, int(totals.sum())),
        hit_rate_basis="in-sample: counts carry no time order to hold any out",
        rankings={str(layer): ranking.tolist() for layer, ranking in zip(moe_layers, rankings, strict=True)},
    )


def _learn_layer(task: tuple[NDArray[np.int16], int, NDArray[np.int64]]) -> LayerCurves:
    routes, experts, counts = task
    return layer_curves(routes, experts, rank_experts(counts), default_pinned_grid(experts))


def learn_from_trace(learn: RoutingTrace, *, workers: int | None = None) -> tuple[NDArray[np.int64], list[LayerCurves]]:
    """Rankings (hottest first, by the learned part's counts) and hit curves of every layer."""
    counts = learn.counts()
    tasks = [(learn.routes[:, index, :], learn.experts, counts[index]) for index in range(len(learn.layers))]
    if workers is None:
        workers = default_workers(learn.steps * len(learn.layers))
    curves = layer_map(_learn_layer, tasks, workers)
    return np.stack([curve.ranking for curve in curves]), curves


def split_from_curves(curves: list[LayerCurves], budget: int, *, min_slots: int) -> list[tuple[int, int]]:
    """(pinned, window) per layer: DP over the learned best-split curves, then each layer's best split."""
    slots = allocate_slots([curve.best for curve in curves], budget, min_slots=min_slots)
    return [(int(curve.best_pinned[s]), s - int(curve.best_pinned[s])) for curve, s in zip(curves, slots, strict=True)]


def trace_plan(
    trace: RoutingTrace,
    moe_layers: tuple[int, ...],
    experts: int,
    budget: int,
    *,
    min_slots: int,
    learn_fraction: float,
    source: str,
    learned: tuple[NDArray[np.int64], list[LayerCurves]] | None = None,
) -> CachePlan:
    """Learn on the first `learn_fraction` of the steps, allocate, split, then score on the rest."""
    _check_layers(trace.layers, trace.experts, moe_layers, experts, f"routing trace {source}")
    learn, score = trace.split(learn_fraction)
    rankings, curves = learned if learned is not None else learn_from_trace(learn)
    splits = split_from_curves(curves, budget, min_slots=min_slots)
    layers: list[LayerCache] = []
    scored_hits = 0
    for index, (layer, (pinned, window), curve) in enumerate(zip(moe_layers, splits, curves, strict=True)):
        s = pinned + window
        hits = pinned_lru_hits(score.routes[:, index, :], experts, rankings[index], [(pinned, s - pinned)])[0]
        scored_hits += hits
        layers.append(
            LayerCache(
                layer=layer,
                slots=s,
                pinned=pinned,
                window=s - pinned,
                learned_hit_rate=float(curve.best[s] / curve.accesses),
                scored_hit_rate=hits / (score.steps * score.top_k),
            )
        )
    return CachePlan(
        strategy="trace",
        source=source,
        total_slots=sum(layer.slots for layer in layers),
        layers=layers,
        learned_steps=learn.steps,
        scored_steps=score.steps,
        expected_hit_rate=scored_hits / (score.steps * score.top_k * len(moe_layers)),
        hit_rate_basis=(f"held out: learned on the first {learn.steps:,} steps, scored on the other {score.steps:,}"),
        rankings={str(layer): rankings[i].tolist() for i, layer in enumerate(moe_layers)},
    )


def plan_cache(
    stats: RoutingTrace | RoutingCounts | None,
    moe_layers: tuple[int, ...],
    experts: int,
    budget: int,
    *,
    min_slots: int,
    learn_fraction: float = 0.8,
    source: str = "",
) -> CachePlan:
    if isinstance(stats, RoutingTrace):
        return trace_plan(
            stats,
            moe_layers,
            experts,
            budget,
            min_slots=min_slots,
            learn_fraction=learn_fraction,
            source=source,
        )
    if isinstance(stats, RoutingCounts):
        return counts_plan(stats, moe_layers, experts, budget, min_slots=min_slots, source=source)
    return uniform_lru_plan(moe_layers, experts, budget)


__all__ = [
    "CachePlan",
    "LayerCache",
    "counts_plan",
    "learn_from_trace",
    "plan_cache",
    "split_from_curves",
    "trace_plan",
    "uniform_lru_plan",
]
