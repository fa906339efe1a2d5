"""The GPU expert-cache plan: slots per layer, and per layer how many hold pinned hot experts vs an LRU
window.

From a routing trace (`recommended_plan`, what `glm53 plan --stats` serves): the same slots for every layer
and the pinned share the recommendation chose (`recommend`: robust over stress scenarios derived from the
trace), scored on the held-out rest. `trace_plan`, the learned alternative that `plan simulate` shows as
"planned": rankings and hit curves learned on the first part, the slot budget split across layers by exact DP
over the learned curves, each layer's pinned/window split hedged against a popularity shift (the learned hits
plus a weight on the hits if every pinned expert went cold: `hedged_split`). From counts only: popularity
without time order, under which pinning the hottest is the best a cache can do, so every slot is pinned.
Without statistics: layers are indistinguishable, so the principled default is the same slots for every layer,
all of them LRU (with no ranking there is nothing to pin).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.plan.cache.allocation import allocate_slots, uniform_split
from glm53.plan.cache.hit_curves import LayerCurves, best_splits, default_pinned_grid, layer_curves
from glm53.plan.cache.recommend import Recommendation, recommend
from glm53.plan.cache.replay import pinned_lru_hits
from glm53.plan.parallel import default_workers, layer_map
from glm53.plan.routing.traces import RoutingCounts, RoutingTrace, rank_experts

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

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
    # Trace plans: the drift hedge (hedged_split) in shares of the learned accesses.
    hedge_weight: float | None = None
    learned_hit_rate_unhedged: float | None = None
    drift_case_hit_rate: float | None = None
    recipe_drift_case_hit_rate: float | None = None
    # Trace plans: each engine's recommended setting (the vllm one is this plan's pinned share).
    recommendation: Recommendation | None = None

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
            fix="record the statistics with this model",
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
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

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


def cross_fitted_hits(routes: NDArray[np.int16], experts: int, grid: NDArray[np.int64]) -> NDArray[np.int64]:
    """hits[i, w] of one layer's learned part, each half scored with the ranking counted on the other half.

    Scored with its own ranking, a trace credits the pins with the ranking's sampling noise (a tail expert
    ranks high because it happened to be drawn often, and then counts those very draws as hits), so in-sample
    curves overvalue pinning; held-out, they are what a learned ranking is worth on tokens it has not seen.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    half = len(routes) // 2
    if half == 0:
        rank = rank_experts(np.bincount(routes.ravel(), minlength=experts))
        return layer_curves(routes, experts, rank, grid).hits
    early, late = routes[:half], routes[half:]
    hits = sum(
        layer_curves(scored, experts, rank_experts(np.bincount(ranked.ravel(), minlength=experts)), grid).hits
        for ranked, scored in ((early, late), (late, early))
    )
    return np.where(hits < 0, -1, hits)  # -1: pinned + window beyond the experts, in both halves


def _learn_layer(task: tuple[NDArray[np.int16], int, NDArray[np.int64], int]) -> LayerCurves:
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    routes, experts, counts, index = task
    grid = default_pinned_grid(experts)
    hits = cross_fitted_hits(routes, experts, grid)
    best, best_pinned = best_splits(grid, hits)
    curves = LayerCurves(routes.size, rank_experts(counts), grid, hits, best, best_pinned)
    # The drift case: the same trace with a ranking that knows nothing (a fixed random order per layer).
    blind = np.random.default_rng([index, 0xD21F7]).permutation(experts).astype(np.int64)
    return replace(curves, drift=layer_curves(routes, experts, blind, grid).hits)


def learn_from_trace(learn: RoutingTrace, *, workers: int | None = None) -> tuple[NDArray[np.int64], list[LayerCurves]]:
    """Rankings (hottest first, by the learned part's counts) and hit curves of every layer (cross-fitted:
    `cross_fitted_hits`)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    counts = learn.counts()
    tasks = [(learn.routes[:, index, :], learn.experts, counts[index], index) for index in range(len(learn.layers))]
    if workers is None:
        workers = default_workers(learn.steps * len(learn.layers))
    curves = layer_map(_learn_layer, tasks, workers)
    return np.stack([curve.ranking for curve in curves]), curves


RECIPE_PINNED_FRACTION = 0.2  # the recipe's own policy: EXL3_PINNED_FRAC=0.2 of the same slots per layer
# The drift case's weight in the objective: learned hits + 0.55 x drift-case hits is, up to a factor, the
# expected hits when 0.55 / 1.55 = 35.5% of the served tokens come after a full re-permutation of popularity.
HEDGE_WEIGHT = 0.55
HEDGE_TOLERANCE = 0.05  # guard: the drift case may fall at most this share of the accesses below the recipe's
HEDGE_MAX_WEIGHT = 1000.0  # at this weight of the drift case the split is as drift-proof as the slots allow
HEDGE_BISECTIONS = 24


@dataclass(frozen=True)
class Hedge:
    """How the pinned/window split was hedged against a popularity shift (see `split_from_curves`)."""

    weight: float  # the drift case's weight in the objective; 0 = not needed
    drift_hits: float  # the plan's expected learned-part hits with every pinned expert re-permuted
    recipe_drift_hits: float  # the recipe's, in the same case
    stationary_hits: int  # the plan's learned-part hits
    unhedged_hits: int  # the unhedged plan's learned-part hits
    accesses: int


def _row(curve: LayerCurves, pinned: int) -> int:
    """The grid row of the pinned count nearest `pinned` (the grid holds every count up to 16)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    return int(np.argmin(np.abs(curve.pinned_counts - pinned)))


def drift_case(curve: LayerCurves, pinned: int, window: int) -> float:
    """Hits of (pinned, window) on the learned part if the popularity were fully re-permuted: the pinned
    experts are then as good as random ones. Measured, not modelled: the learned part replayed with the
    pinned set drawn from a random ranking (an LRU's hits do not depend on which experts are hot)."""
    if curve.drift is None:
        raise ValueError("curves learned without their drift case")
    row = _row(curve, pinned)
    return float(curve.drift[row, min(window, len(curve.ranking) - int(curve.pinned_counts[row]))])


def _split_at(curve: LayerCurves, slots: int, weight: float) -> tuple[int, int]:
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    assert curve.drift is not None
    grid = curve.pinned_counts
    rows = np.flatnonzero(grid <= slots)
    windows = slots - grid[rows]
    value = curve.hits[rows, windows] + weight * curve.drift[rows, windows]
    choice = int(rows[int(np.argmax(value))])
    return int(grid[choice]), slots - int(grid[choice])


def split_from_curves(
    curves: list[LayerCurves], budget: int, *, min_slots: int, hedged: bool = True, tolerance: float | None = None
) -> list[tuple[int, int]]:
    return hedged_split(curves, budget, min_slots=min_slots, hedged=hedged, tolerance=tolerance)[0]


def hedged_split(
    curves: list[LayerCurves], budget: int, *, min_slots: int, hedged: bool = True, tolerance: float | None = None
) -> tuple[list[tuple[int, int]], Hedge]:
    """(pinned, window) per layer.

    Pinned vs window per layer: the learned optimum pins 70-95% of the slots, which is right while the ranking
    holds and badly wrong once popularity moves. Hedged, each layer maximises
        learned hits + weight x hits in the drift case (every pinned expert re-permuted, `drift_case`)
    with weight HEDGE_WEIGHT (a prior: 35.5% of the served tokens come after a full re-permutation), and the
    slots across layers come from an exact DP over each layer's best value of that same objective. Where the
    drift case would still fall more than `tolerance` (a share of the accesses) below the recipe's own policy
    (20% pinned of uniform slots) in the same case, the weight is raised by bisection over the splits of the
    learned DP's slots (a re-permutation keeps each layer's skew and reuse pattern, so those slots do not
    depend on which experts are hot), then the slots are re-split at that weight when no worse.
    Unhedged: the learned DP's slots and each layer's best learned split. The knobs are the engine's: slots and
    pinned count per layer (EXL3_LRU_CAPACITY_PLAN) and the rankings file; nothing else changes.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    tolerance = HEDGE_TOLERANCE if tolerance is None else tolerance
    experts = len(curves[0].ranking) if curves else 0
    slots = allocate_slots([curve.best for curve in curves], budget, min_slots=min_slots)
    accesses = sum(curve.accesses for curve in curves)
    uniform = uniform_split(sum(slots), len(curves), experts)
    recipe = 0.0
    for curve, s in zip(curves, uniform, strict=True):
        pinned = round(RECIPE_PINNED_FRACTION * s)
        recipe += drift_case(curve, pinned, s - pinned)

    def stationary(splits: list[tuple[int, int]]) -> int:
        return sum(
            int(curve.hits[int(np.searchsorted(curve.pinned_counts, p)), w])
            for curve, (p, w) in zip(curves, splits, strict=True)
        )

    unhedged = [(int(c.best_pinned[s]), s - int(c.best_pinned[s])) for c, s in zip(curves, slots, strict=True)]

    def at(weight: float) -> tuple[list[tuple[int, int]], float]:
        splits = unhedged if weight == 0 else [_split_at(c, s, weight) for c, s in zip(curves, slots, strict=True)]
        return splits, sum(drift_case(c, p, w) for c, (p, w) in zip(curves, splits, strict=True))

    def joint(weight: float) -> list[tuple[int, int]]:
        # Slots across layers by the DP over each layer's best learned + weight x drift-case value: the same
        # Lagrangian as the split, so slots and split optimise one objective.
        combined = []
        for curve in curves:
            assert curve.drift is not None
            hedged_value = np.where(curve.hits >= 0, curve.hits + weight * curve.drift, -np.inf)
            best = np.full(len(curve.best), -np.inf)
            for row, pinned in enumerate(curve.pinned_counts.tolist()):
                best[pinned:] = np.maximum(best[pinned:], hedged_value[row, : len(best) - pinned])
            combined.append(np.round(best * 16).astype(np.int64))
        allocated = allocate_slots(combined, budget, min_slots=min_slots)
        return [_split_at(c, s, weight) for c, s in zip(curves, allocated, strict=True)]

    def drift_of(splits: list[tuple[int, int]]) -> float:
        return sum(drift_case(c, p, w) for c, (p, w) in zip(curves, splits, strict=True))

    floor = recipe - tolerance * accesses
    chosen, drift = at(0.0)
    weight = 0.0
    if hedged:
        weight = HEDGE_WEIGHT
        chosen = joint(weight)
        drift = drift_of(chosen)
    if hedged and drift < floor:
        # The drift case rises with the weight (a Lagrangian): bisect for the smallest weight that holds it
        # (slots fixed by the learned DP, one DP per step would cost seconds).
        low, high = HEDGE_WEIGHT, HEDGE_MAX_WEIGHT
        chosen, drift = at(high)
        weight = high
        for _ in range(HEDGE_BISECTIONS):
            middle = (low + high) / 2
            splits, value = at(middle)
            if value >= floor:
                high, chosen, drift, weight = middle, splits, value, middle
            else:
                low = middle
        # Re-split the slots across layers at that weight too; kept when it is no worse on either count.
        resplit = joint(weight)
        resplit_drift = drift_of(resplit)
        if resplit_drift >= floor and stationary(resplit) >= stationary(chosen):
            chosen, drift = resplit, resplit_drift
    hedge = Hedge(
        weight=weight,
        drift_hits=drift,
        recipe_drift_hits=recipe,
        stationary_hits=stationary(chosen),
        unhedged_hits=stationary(unhedged),
        accesses=accesses,
    )
    return chosen, hedge


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
    splits, hedge = hedged_split(curves, budget, min_slots=min_slots)
    return _held_out_plan(
        learn,
        score,
        moe_layers,
        experts,
        rankings,
        [
            (pinned + window, pinned, float(curve.hits[_row(curve, pinned), window] / curve.accesses))
            for (pinned, window), curve in zip(splits, curves, strict=True)
        ],
        source=source,
        hedge=hedge,
    )


def recommended_plan(
    trace: RoutingTrace,
    moe_layers: tuple[int, ...],
    experts: int,
    budget: int,
    *,
    learn_fraction: float,
    source: str,
) -> CachePlan:
    """The recipe's engine as recommended (`recommend`): the same slots for every layer, the recommended
    share of them pinned by the rankings learned on the first `learn_fraction`, the rest LRU; scored on the
    rest of the trace. The recommendation is robust to drift the learning part does not show, so it pins
    only what no stress scenario punishes (often nothing: plain LRU)."""
    _check_layers(trace.layers, trace.experts, moe_layers, experts, f"routing trace {source}")
    learn, score = trace.split(learn_fraction)
    choice = recommend(
        trace, budget / (len(moe_layers) * experts), engines=("vllm", "proposed"), learn_steps=learn.steps
    )
    share = choice.engine("vllm").choice.pinned_fraction or 0.0
    counts = learn.counts()
    rankings = [rank_experts(row) for row in counts]
    layers = []
    for index, slots in enumerate(uniform_split(budget, len(moe_layers), experts)):
        pinned = round(share * slots)
        learned = pinned_lru_hits(learn.routes[:, index, :], experts, rankings[index], [(pinned, slots - pinned)])[0]
        layers.append((slots, pinned, learned / (learn.steps * learn.top_k)))
    return _held_out_plan(learn, score, moe_layers, experts, rankings, layers, source=source, recommendation=choice)


def _held_out_plan(
    learn: RoutingTrace,
    score: RoutingTrace,
    moe_layers: tuple[int, ...],
    experts: int,
    rankings: NDArray[np.int64] | list[NDArray[np.int64]],
    layers: list[tuple[int, int, float]],
    *,
    source: str,
    hedge: Hedge | None = None,
    recommendation: Recommendation | None = None,
) -> CachePlan:
    """A trace plan from each layer's (slots, pinned, learned hit rate), every layer scored on the held-out
    `score` part with the rankings learned on `learn`: the pinned hottest, the rest of the slots LRU."""
    caches: list[LayerCache] = []
    scored_hits = 0
    for index, (layer, (slots, pinned, learned_hit_rate)) in enumerate(zip(moe_layers, layers, strict=True)):
        hits = pinned_lru_hits(score.routes[:, index, :], experts, rankings[index], [(pinned, slots - pinned)])[0]
        scored_hits += hits
        caches.append(
            LayerCache(
                layer=layer,
                slots=slots,
                pinned=pinned,
                window=slots - pinned,
                learned_hit_rate=learned_hit_rate,
                scored_hit_rate=hits / (score.steps * score.top_k),
            )
        )
    accesses = max(1, hedge.accesses) if hedge is not None else 1
    return CachePlan(
        strategy="trace",
        source=source,
        total_slots=sum(cache.slots for cache in caches),
        layers=caches,
        learned_steps=learn.steps,
        scored_steps=score.steps,
        expected_hit_rate=scored_hits / (score.steps * score.top_k * len(moe_layers)),
        hit_rate_basis=(f"held out: learned on the first {learn.steps:,} steps, scored on the other {score.steps:,}"),
        rankings={str(layer): rankings[i].tolist() for i, layer in enumerate(moe_layers)},
        hedge_weight=hedge.weight if hedge is not None else None,
        learned_hit_rate_unhedged=hedge.unhedged_hits / accesses if hedge is not None else None,
        drift_case_hit_rate=hedge.drift_hits / accesses if hedge is not None else None,
        recipe_drift_case_hit_rate=hedge.recipe_drift_hits / accesses if hedge is not None else None,
        recommendation=recommendation,
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
        return recommended_plan(stats, moe_layers, experts, budget, learn_fraction=learn_fraction, source=source)
    if isinstance(stats, RoutingCounts):
        return counts_plan(stats, moe_layers, experts, budget, min_slots=min_slots, source=source)
    return uniform_lru_plan(moe_layers, experts, budget)


__all__ = [
    "CachePlan",
    "Hedge",
    "LayerCache",
    "counts_plan",
    "cross_fitted_hits",
    "drift_case",
    "hedged_split",
    "learn_from_trace",
    "plan_cache",
    "recommended_plan",
    "split_from_curves",
    "trace_plan",
    "uniform_lru_plan",
]
