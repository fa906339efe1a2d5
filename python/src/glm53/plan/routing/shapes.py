"""Named synthetic trace shapes (`glm53 plan trace synth --shape NAME`) and the stress scenarios derived from a
user's trace (what a recommendation must hold up against).

Every shape starts from `synthesize_trace` (per-layer Zipf popularity, temporal locality) and, where it drifts,
moves popularity by relabelling experts from a step on, so locality and each layer's skew stay as they were:

    stationary            locality 0.3 (`stationary-0.5`: locality 0.5)
    repermute-15/50/85    popularity fully re-permuted at 15%, 50% or 85% of the steps
    rotation              the ranking slides: every steps / experts steps the hottest rank passes to the next
                          expert down the original ranking, so the hot set moves through every expert once
    tenants               two tenants with unrelated popularity alternate in blocks of 500 steps
    bursty                sessions of a topic (one of 4 unrelated popularities), lengths exponential, mean 400
    learn-2%              stationary, learned on its first 2% only
    zipf-0.6, zipf-1.2    every layer at that Zipf skew
    correlated            each slot of a layer repeats a fixed image of the previous layer's expert in that
                          slot with probability 0.5 (adjacent layers pick related experts)

Seeded: the same shape, seed and size give the same trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glm53.errors import BadInput
from glm53.plan.routing.traces import RoutingTrace, SyntheticTraceSpec, drift_trace, rank_experts, synthesize_trace

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

TENANT_BLOCK = 500
BURST_MEAN = 400
BURST_TOPICS = 4
CORRELATION = 0.5


@dataclass(frozen=True)
class TraceShape:
    name: str
    description: str
    learn_fraction: float = 0.2


SHAPES: dict[str, TraceShape] = {
    shape.name: shape
    for shape in (
        TraceShape("stationary", "stationary popularity, locality 0.3"),
        TraceShape("stationary-0.5", "stationary popularity, locality 0.5"),
        TraceShape("repermute-15", "popularity re-permuted at 15% of the steps"),
        TraceShape("repermute-50", "popularity re-permuted at 50% of the steps"),
        TraceShape("repermute-85", "popularity re-permuted at 85% of the steps"),
        TraceShape("rotation", "the ranking slides slowly through every expert"),
        TraceShape("tenants", f"two tenants alternating every {TENANT_BLOCK} steps"),
        TraceShape("bursty", f"sessions of one of {BURST_TOPICS} topics, mean {BURST_MEAN} steps"),
        TraceShape("learn-2%", "stationary, learned on its first 2%", learn_fraction=0.02),
        TraceShape("zipf-0.6", "every layer at Zipf skew 0.6"),
        TraceShape("zipf-1.2", "every layer at Zipf skew 1.2"),
        TraceShape("correlated", "adjacent layers pick related experts"),
    )
}


def relabel_blocks(trace: RoutingTrace, labels: NDArray[np.int64], maps: NDArray[np.int64]) -> RoutingTrace:
    """Step t's ids of layer l pass through maps[labels[t], l]: a per-step choice among relabellings."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    routes = trace.routes.astype(np.int64)
    layer_index = np.arange(len(trace.layers))[None, :, None]
    out = maps[labels[:, None, None], layer_index, routes]
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, out.astype(np.int16))


def _permutations(trace: RoutingTrace, count: int, seed: int) -> NDArray[np.int64]:
    """`count` relabellings per layer: the first the identity, the others unrelated (full re-permutations)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    rng = np.random.default_rng([seed, 0x7E7A])
    layers, experts = len(trace.layers), trace.experts
    maps = np.empty((count, layers, experts), dtype=np.int64)
    maps[0] = np.arange(experts)
    for index in range(1, count):
        maps[index] = np.stack([rng.permutation(experts) for _ in range(layers)])
    return maps


def tenants(trace: RoutingTrace, block: int = TENANT_BLOCK, seed: int = 0, start: int = 0) -> RoutingTrace:
    """Two tenants with unrelated popularity alternating every `block` steps (from step `start` on)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps = np.arange(trace.steps)
    labels = np.where(steps < start, 0, ((steps - start) // block) % 2)
    return relabel_blocks(trace, labels, _permutations(trace, 2, seed))


def bursty(
    trace: RoutingTrace, mean: int = BURST_MEAN, topics: int = BURST_TOPICS, seed: int = 0, start: int = 0
) -> RoutingTrace:
    """Sessions of one topic each (one of `topics` unrelated popularities, a topic may come back), lengths
    drawn exponential with mean `mean` steps; steps before `start` keep the first topic."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    rng = np.random.default_rng([seed, 0xB0257])
    labels = np.zeros(trace.steps, dtype=np.int64)
    position, topic = start, 0
    while position < trace.steps:
        length = max(1, int(rng.exponential(mean)))
        labels[position : position + length] = topic
        position += length
        topic = int(rng.integers(topics))
    return relabel_blocks(trace, labels, _permutations(trace, topics, seed))


def rotation(trace: RoutingTrace, period: int | None = None, start: int = 0) -> RoutingTrace:
    """The ranking slides: from step `start` on, every `period` steps (default steps / experts: one full turn
    over the trace) each rank's draws pass to the expert one place further down the trace's own ranking, so
    the coldest expert becomes the hottest and every other one steps down one rank."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    period = max(1, trace.steps // trace.experts) if period is None else period
    routes = trace.routes.astype(np.int64)
    out = routes.copy()
    shift = np.maximum(0, np.arange(trace.steps) - start) // period
    for index in range(len(trace.layers)):
        ranking = rank_experts(np.bincount(routes[:, index, :].ravel(), minlength=trace.experts))
        rank_of = np.empty(trace.experts, dtype=np.int64)
        rank_of[ranking] = np.arange(trace.experts)
        out[:, index, :] = ranking[(rank_of[routes[:, index, :]] + shift[:, None]) % trace.experts]
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, out.astype(np.int16))


def continued(trace: RoutingTrace, start: int) -> RoutingTrace:
    """The drift the learning part shows, carried on from step `start`: the learning part's last half replayed
    again and again, each replay relabelled once more by the map that takes the expert at each rank of the first
    half's ranking to the expert at the same rank of the last half's. A ranking that slides keeps sliding at its
    own pace (a replay starts where the one before it ended), and a stationary one barely moves (its map swaps
    only experts of about equal rank)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    after = trace.steps - start
    if start < 2 or after <= 0:
        return trace
    half = start // 2
    first_counts, last_counts = trace.slice(0, start - half).counts(), trace.slice(start - half, start).counts()
    replays = -(-after // half)
    body = np.tile(trace.routes[start - half : start].astype(np.int64), (replays, 1, 1))[:after]
    for index in range(len(trace.layers)):
        step_map = np.empty(trace.experts, dtype=np.int64)
        step_map[rank_experts(first_counts[index])] = rank_experts(last_counts[index])
        relabel = np.arange(trace.experts)
        # one replay at a time: memory stays one map, however many replays a short learning part makes
        for replay in range(replays):
            relabel = step_map[relabel]
            rows = slice(replay * half, (replay + 1) * half)
            body[rows, index, :] = relabel[body[rows, index, :]]
    return RoutingTrace(
        trace.layers, trace.experts, trace.top_k, np.concatenate([trace.routes[:start], body.astype(np.int16)])
    )


def correlate_layers(trace: RoutingTrace, probability: float = CORRELATION, seed: int = 0) -> RoutingTrace:
    """Each slot of layer l + 1 repeats a fixed image (per layer pair, a random permutation) of layer l's
    expert in that slot with `probability`; a repeat that collides with the step's other ids is dropped."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    rng = np.random.default_rng([seed, 0xC0AA])
    routes = trace.routes.astype(np.int64)
    for index in range(1, len(trace.layers)):
        image = rng.permutation(trace.experts)
        copy = rng.random(routes.shape[::2]) < probability  # (steps, top_k)
        proposed = np.where(copy, image[routes[:, index - 1, :]], routes[:, index, :])
        routes[:, index, :] = _distinct(proposed, routes[:, index, :])
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, routes.astype(np.int16))


def _distinct(proposed: NDArray[np.int64], own: NDArray[np.int64]) -> NDArray[np.int64]:
    """Where a step's proposed ids repeat, the later slot falls back to the layer's own draw at the first
    slot whose own id is not yet used (own ids are distinct, so one always remains)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    out = proposed.copy()
    top_k = out.shape[1]
    for slot in range(1, top_k):
        clash = (out[:, slot : slot + 1] == out[:, :slot]).any(axis=1)
        for row in np.flatnonzero(clash).tolist():
            used = set(out[row, :slot].tolist())
            out[row, slot] = next(e for e in own[row].tolist() if e not in used and e not in out[row, slot:])
    return out


def make_shape(
    name: str,
    *,
    seed: int = 0,
    steps: int = 20_000,
    layers: Sequence[int] = tuple(range(3, 45)),
    experts: int = 288,
    top_k: int = 8,
) -> RoutingTrace:
    """The trace of a named shape (see the module's docstring)."""
    if name not in SHAPES:
        raise BadInput(f"unknown trace shape {name!r}", fix="one of: " + ", ".join(SHAPES))
    base = {"layers": tuple(layers), "experts": experts, "top_k": top_k, "steps": steps, "seed": seed}
    if name == "stationary-0.5":
        return synthesize_trace(SyntheticTraceSpec(**base, locality=0.5))
    if name.startswith("zipf-"):
        skew = float(name.split("-")[1])
        return synthesize_trace(SyntheticTraceSpec(**base, skew_min=skew, skew_max=skew))
    trace = synthesize_trace(SyntheticTraceSpec(**base))
    if name.startswith("repermute-"):
        return drift_trace(trace, [(int(name.split("-")[1]) / 100, 1.0)], seed)
    if name == "rotation":
        return rotation(trace)
    if name == "tenants":
        return tenants(trace, seed=seed)
    if name == "bursty":
        return bursty(trace, seed=seed)
    if name == "correlated":
        return correlate_layers(trace, seed=seed)
    return trace  # stationary, learn-2%


def stress_scenarios(trace: RoutingTrace, seed: int = 0, start: int | None = None) -> dict[str, RoutingTrace]:
    """The user's trace and what a recommendation must survive, each changing from step `start` on (default
    the midpoint; the steps before it, the learning part, are the user's own): popularity re-permuted, the
    ranking sliding through half the experts, the learning part's own drift carried on at its pace
    (`continued`), two tenants alternating, bursty sessions."""
    middle = trace.steps // 2 if start is None else start
    period = max(1, (trace.steps - middle) * 2 // trace.experts)
    block = max(1, min(TENANT_BLOCK, (trace.steps - middle) // 4))
    return {
        "trace": trace,
        "re-permuted": drift_trace(trace, [(middle / trace.steps, 1.0)], seed) if 0 < middle < trace.steps else trace,
        "rotated": rotation(trace, period, start=middle),
        "continued": continued(trace, middle),
        "tenants": tenants(trace, block, seed, start=middle),
        "bursty": bursty(trace, max(1, block), seed=seed, start=middle),
    }


__all__ = [
    "SHAPES",
    "TraceShape",
    "bursty",
    "continued",
    "correlate_layers",
    "make_shape",
    "relabel_blocks",
    "rotation",
    "stress_scenarios",
    "tenants",
]
