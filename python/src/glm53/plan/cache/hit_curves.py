"""Per-layer hit curves for every capacity and every pinned/LRU split, in one pass over a trace (stack
distances).

The cache model, per layer, with `pinned` slots holding the layer's hottest experts and `window` slots run as
LRU: at each step the layer looks up its top_k experts (hits are experts already resident), then loads the
misses; afterwards the LRU window keeps the `window` most recently used unpinned experts, recency ordered by
(step, position in the step). This is a stack algorithm, so an access hits a window of size w exactly when its
stack distance (the number of unpinned experts used more recently than its own previous use) is below w. One
pass computes, for every pinned count n, the distance each access would have if the n hottest experts were
pinned; a 2-D histogram then gives hits(n, w) for all n and w at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


def last_use_before_step(routes: NDArray[np.integer], experts: int) -> NDArray[np.int32]:
    """For one layer's (steps, top_k) ids: row t = each expert's last use time before step t (-1: never).

    Time is step * top_k + position, so ties inside a step break by position.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, top_k = routes.shape
    marks = np.full((steps, experts), -1, dtype=np.int32)
    times = np.arange(steps, dtype=np.int32)[:, None] * top_k + np.arange(top_k, dtype=np.int32)[None, :]
    marks[np.arange(steps)[:, None], routes] = times
    np.maximum.accumulate(marks, axis=0, out=marks)
    before = np.empty_like(marks)
    before[0] = -1
    before[1:] = marks[:-1]
    return before


def stack_distances(
    routes: NDArray[np.integer], experts: int, unpinned: NDArray[np.bool_] | None = None
) -> NDArray[np.int32]:
    """Stack distance of every access (steps, top_k) among unpinned experts; `experts` marks a cold access.

    Accesses to pinned experts get distance -1 (they always hit).
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    before = last_use_before_step(routes, experts)
    previous = np.take_along_axis(before, routes.astype(np.int64), axis=1)  # (steps, top_k)
    columns = before if unpinned is None else before[:, unpinned]
    distances = (columns[:, None, :] > previous[:, :, None]).sum(axis=2, dtype=np.int32)
    distances[previous < 0] = experts
    if unpinned is not None:
        distances[~unpinned[routes]] = -1
    result: NDArray[np.int32] = distances
    return result


@dataclass(frozen=True)
class LayerCurves:
    """Hit counts of one layer over a trace part, for every capacity and each considered pinned count.

    hits[i, w]: hits with the pinned_counts[i] hottest experts pinned and an LRU window of w slots
    (-1 where pinned + window exceeds the expert count); best[c] / best_pinned[c]: the most hits with c slots
    in all and the pinned count that achieves it.
    """

    accesses: int
    ranking: NDArray[np.int64]  # expert ids, hottest first
    pinned_counts: NDArray[np.int64]
    hits: NDArray[np.int64]
    best: NDArray[np.int64]  # (experts + 1,)
    best_pinned: NDArray[np.int64]
    # Optional: hits[i, w] with pinned_counts[i] experts pinned by a random ranking instead (what pinning by a
    # stale ranking is worth once popularity is fully re-permuted); see cache_plan.hedged_split.
    drift: NDArray[np.int64] | None = None

    def lru_only(self) -> NDArray[np.int64]:

        row: NDArray[np.int64] = self.hits[0]
        return row


def default_pinned_grid(experts: int) -> NDArray[np.int64]:
    """Pinned counts the planner considers: every count up to 16, then steps of about 1/16 of the value.

    A finer grid changes the chosen split by a slot or two and the hit rate by a few hundredths of a point.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    grid = {0, experts}
    value = 0
    while value < experts:
        grid.add(value)
        value += max(1, value // 16)
    return np.array(sorted(grid), dtype=np.int64)


def layer_curves(
    routes: NDArray[np.integer],
    experts: int,
    ranking: NDArray[np.int64],
    pinned_grid: NDArray[np.int64] | None = None,
) -> LayerCurves:
    """One pass over a layer's (steps, top_k) accesses -> hits for every (pinned, window) pair.

    `pinned_grid` (sorted, starting at 0) limits the pinned counts considered; None considers all of them.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    grid = np.arange(experts + 1, dtype=np.int64) if pinned_grid is None else np.asarray(pinned_grid, np.int64)
    if grid[0] != 0 or np.any(np.diff(grid) <= 0) or grid[-1] > experts:
        raise ValueError("pinned_grid must rise strictly from 0 to at most the expert count")
    steps, top_k = routes.shape
    rank_of = np.empty(experts, dtype=np.int64)
    rank_of[ranking] = np.arange(experts)
    ranked_routes = rank_of[routes]  # ids replaced by popularity rank: pinning n = pinning ranks < n
    before = last_use_before_step(ranked_routes, experts)
    previous = np.take_along_axis(before, ranked_routes, axis=1)
    size = experts + 1
    inner = grid[grid < experts]  # a block of ranks starts at each of these
    groups = len(inner)
    dump = groups * size  # collects the (access, n) pairs where n pins the accessed expert itself
    histogram = np.zeros(dump + 1, dtype=np.int64)
    chunk = max(1, (1 << 22) // (top_k * experts))
    row_offsets = (np.arange(groups, dtype=np.int32) * size)[None, None, :]
    for start in range(0, steps, chunk):
        prev = previous[start : start + chunk]
        ranks = ranked_routes[start : start + chunk]
        newer = before[start : start + chunk][:, None, :] > prev[:, :, None]  # (t, k, rank)
        # Experts used since this access's previous use, per block of ranks, then summed from the cold end:
        # suffix[t, k, i] = the stack distance when the inner[i] hottest experts are pinned.
        blocks = np.add.reduceat(newer, inner, axis=2, dtype=np.int32)
        suffix = np.cumsum(blocks[:, :, ::-1], axis=2, dtype=np.int32)[:, :, ::-1]
        suffix += row_offsets
        cold = np.nonzero(prev < 0)
        suffix[cold[0], cold[1], :] = row_offsets[0, 0] + experts
        # Pinning n > rank pins the accessed expert itself: a pinned hit, counted from the ranks below.
        flat = np.where(inner[None, None, :] <= ranks[:, :, None], suffix, dump)
        histogram += np.bincount(flat.ravel(), minlength=dump + 1)
    by_distance = histogram[:dump].reshape(groups, size)
    lru = np.zeros((len(grid), size), dtype=np.int64)
    lru[:groups, 1:] = np.cumsum(by_distance, axis=1)[:, :-1]  # window w hits distances 0..w-1
    rank_counts = np.bincount(ranked_routes.ravel(), minlength=experts)
    pinned_hits = np.concatenate([[0], np.cumsum(rank_counts)])[grid]  # accesses to ranks < n
    hits = pinned_hits[:, None] + lru
    windows = np.arange(size)[None, :]
    hits[grid[:, None] + windows > experts] = -1
    best, best_pinned = best_splits(grid, hits)
    return LayerCurves(steps * top_k, ranking, grid, hits, best, best_pinned)


def best_splits(grid: NDArray[np.int64], hits: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per capacity c (0..experts): the most hits over pinned counts n <= c with window c - n, and that n."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    size = hits.shape[1]
    best = np.zeros(size, dtype=np.int64)
    best_pinned = np.zeros(size, dtype=np.int64)
    for capacity in range(size):
        rows = np.flatnonzero(grid <= capacity)
        diagonal = hits[rows, capacity - grid[rows]]
        choice = int(np.argmax(diagonal))
        best[capacity], best_pinned[capacity] = diagonal[choice], grid[rows[choice]]
    return best, best_pinned


__all__ = [
    "LayerCurves",
    "best_splits",
    "default_pinned_grid",
    "last_use_before_step",
    "layer_curves",
    "stack_distances",
]
