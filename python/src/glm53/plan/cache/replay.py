"""Replay a routing trace through expert-cache policies and count hits per layer.

All policies share the step model of `miss_ratio`: each step looks its top_k experts up, then loads the
misses; afterwards a layer's cache keeps at most its slot count. LRU-type policies (pinned hottest + LRU
window) are scored through stack distances, vectorised; Belady's MIN keeps, after each step, the experts
needed soonest (a tight loop over a heap): no policy with the same slots per layer can hit more.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glm53.plan.cache.policies import pinned_lru_masks

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


@dataclass(frozen=True)
class CachePolicy:
    """Per layer: the pinned expert count (hottest first by `rankings`) and the LRU window in slots."""

    name: str
    pinned: tuple[int, ...]
    window: tuple[int, ...]

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(p + w for p, w in zip(self.pinned, self.window, strict=True))


def pinned_lru_hits(
    routes: NDArray[np.integer], experts: int, ranking: NDArray[np.int64], splits: Sequence[tuple[int, int]]
) -> list[int]:
    """Hits of one layer's (steps, top_k) accesses under each (pinned, window) split, in one pass.

    An unpinned access hits when fewer than `window` unpinned experts were used since its previous use: the
    experts used since then, minus those among the pinned ranks.
    """
    # One pass shared with the per-step replay (glm53.plan.cache.policies): the hits are its masks' counts.
    return [int(mask.sum()) for mask in pinned_lru_masks(routes, experts, ranking, list(splits))]


def belady_hits(routes: NDArray[np.integer], capacity: int, experts: int | None = None) -> int:
    """Belady's MIN at step granularity for one layer's (steps, top_k) accesses.

    The cache starts holding the experts needed first (pinned policies also start loaded). After each step it
    keeps the `capacity` experts whose next use comes soonest; with slots to spare nothing is dropped. No
    policy with the same slots can hit more (it is the optimum of the step model: the farthest-next-use expert
    is always the best one to give up). A tight loop over a heap of plain integers: next-use times are unique
    per access, so a time also names its expert.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, top_k = routes.shape
    experts = int(routes.max()) + 1 if experts is None else experts
    flat = routes.ravel().astype(np.int64)
    next_time = _next_use_times(routes, experts).ravel()
    # Expert used at each time; times from steps * top_k on are the "not again" sentinels, one per expert.
    who = flat.tolist() + list(range(experts))
    times = next_time.tolist()
    held = [-1] * experts  # next-use time of each cached expert, -1 when not cached
    # Start warm, like pinned policies: preload the experts needed first (the same rule, before step 0).
    first_use = np.full(experts, steps * top_k, dtype=np.int64) + np.arange(experts)
    np.minimum.at(first_use, flat, np.arange(flat.size))
    preload = np.argsort(first_use)[: min(capacity, experts)]
    for expert in preload.tolist():
        held[expert] = int(first_use[expert])
    heap: list[int] = [-held[expert] for expert in preload.tolist()]
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    size, hits = len(heap), 0
    position = 0
    for _ in range(steps):
        for _ in range(top_k):
            upcoming = times[position]
            expert = who[position]
            position += 1
            if held[expert] >= 0:
                hits += 1
            else:
                size += 1
            held[expert] = upcoming
            push(heap, -upcoming)
        while size > capacity:
            upcoming = -pop(heap)
            expert = who[upcoming]
            if held[expert] == upcoming:
                held[expert] = -1
                size -= 1
    return hits


def _next_use_times(routes: NDArray[np.integer], experts: int) -> NDArray[np.int64]:
    """For each access, the time (step * top_k + position) of the same expert's next use; an expert not used
    again gets steps * top_k + its id, so that times stay unique and still name their expert."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, top_k = routes.shape
    flat = routes.ravel().astype(np.int64)
    time = np.arange(flat.size, dtype=np.int64)
    order = np.lexsort((time, flat))
    nxt = (steps * top_k + flat).astype(np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = time[order[1:][same]]
    shaped: NDArray[np.int64] = nxt.reshape(steps, top_k)
    return shaped


__all__ = ["CachePolicy", "belady_hits", "pinned_lru_hits"]
