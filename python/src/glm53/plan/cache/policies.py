"""Expert-placement policies as the engines run them, replayed step by step over a routing trace.

Every replay returns the selections served from GPU-resident experts, per step and layer (`StepHits`), so the
same result gives a hit rate over any part of the trace and the per-step work the cost model prices.

    pinned_lru_step_hits   the recipe's engine: per-layer LRU with the hottest experts pinned
                           (EXL3_LRU_CAPACITY_PLAN / EXL3_PINNED_FRAC / EXL3_VMM_HOT_RANKINGS); a miss is loaded
                           into the cache after the step's lookups (the step model of `miss_ratio`)
    exl3_dynamic           ExLlamaV3 1.4.6's dynamic CPU split (exllamav3/modules/block_sparse_mlp_cpu.py at
                           499890c): a placement that changes only at sweeps, never on a miss
    exl3_static            the same split with a stats file (EXL3_MOE_CPU_SWAP=0, EXL3_MOE_CPU_SPLIT_STATS)
    decayed_frequency      proposed, run by neither engine today: after each step a layer keeps the experts of
                           its last `recent` steps and fills the other slots with the highest decayed counts
                           (half-life in steps) among what it holds and what it just used

A miss under the recipe's engine is a copy (or a CPU computation) and the expert is then cached; under
ExLlamaV3's split a CPU-resident expert is computed on the CPU and stays there until a sweep moves it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glm53.plan.cache.hit_curves import last_use_before_step

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# ExLlamaV3's dynamic placement defaults (block_sparse_mlp_cpu.py: EXL3_MOE_CPU_SWAP_INTERVAL, _HYST, _FLOOR, _MAX).
SWAP_INTERVAL = 128
SWAP_HYSTERESIS = 2.0
SWAP_FLOOR = 8.0
SWAP_MAX = 64
# _split_swap_tick: a pending sweep runs inline once the tick count reaches this many intervals.
INLINE_SWEEP_INTERVALS = 4


@dataclass(frozen=True)
class StepHits:
    """hits[step, layer]: selections served from the GPU; `swaps[i]` swaps made at the sweep after step
    `sweep_steps[i]`, `turns[i]` the split layers that took a turn in it (ExLlamaV3's dynamic placement only)."""

    hits: NDArray[np.int16]
    sweep_steps: NDArray[np.int64] | None = None  # None: no sweeps
    swaps: NDArray[np.int64] | None = None
    # ExLlamaV3's split: cpu[layer, expert] after the last step (the placement the engine would hold).
    final_cpu: NDArray[np.bool_] | None = None
    turns: NDArray[np.int64] | None = None

    def total(self, start: int = 0, stop: int | None = None) -> int:
        import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

        return int(self.hits[start:stop].sum(dtype=np.int64))

    def swaps_between(self, start: int, stop: int | None = None) -> int:
        within = self._sweeps_within(start, stop)
        return 0 if within is None or self.swaps is None else int(self.swaps[within].sum())

    def turns_between(self, start: int, stop: int | None = None) -> int:
        within = self._sweeps_within(start, stop)
        return 0 if within is None or self.turns is None else int(self.turns[within].sum())

    def sweeps_between(self, start: int, stop: int | None = None) -> int:
        within = self._sweeps_within(start, stop)
        return 0 if within is None else int(within.sum())

    def _sweeps_within(self, start: int, stop: int | None) -> NDArray[np.bool_] | None:
        """Which sweeps come after steps start .. stop - 1 (None: no sweeps)."""
        if self.sweep_steps is None:
            return None
        end = len(self.hits) if stop is None else stop
        within: NDArray[np.bool_] = (self.sweep_steps >= start) & (self.sweep_steps < end)
        return within


def pinned_lru_masks(
    routes: NDArray[np.integer], experts: int, ranking: NDArray[np.int64], splits: list[tuple[int, int]]
) -> list[NDArray[np.bool_]]:
    """Per (pinned, window) split, which of one layer's (steps, top_k) accesses hit, in one pass.

    An unpinned access hits when fewer than `window` unpinned experts were used since its previous use: the
    experts used since then, minus those among the pinned ranks.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, top_k = routes.shape
    rank_of = np.empty(experts, dtype=np.int64)
    rank_of[ranking] = np.arange(experts)
    ranked = rank_of[routes]
    before = last_use_before_step(ranked, experts)
    previous = np.take_along_axis(before, ranked, axis=1)
    pinned_counts = sorted({pinned for pinned, _ in splits if 0 < pinned < experts})
    bounds = [0, *pinned_counts, experts]
    # newer_below[n]: experts among the n hottest used since an access's previous use; n = experts gives all.
    newer_below = {n: np.zeros((steps, top_k), dtype=np.int32) for n in bounds[1:]}
    chunk = max(1, (1 << 21) // (top_k * experts))
    for start in range(0, steps, chunk):
        rows = before[start : start + chunk]
        prev = previous[start : start + chunk][:, :, None]
        running = np.zeros(prev.shape[:2], dtype=np.int32)
        for low, high in itertools.pairwise(bounds):  # each column is compared once
            running += np.count_nonzero(rows[:, None, low:high] > prev, axis=2).astype(np.int32)
            newer_below[high][start : start + chunk] = running
    newer_all = newer_below[experts]
    warm = previous >= 0
    masks = []
    for pinned, window in splits:
        if pinned >= experts:
            masks.append(np.ones((steps, top_k), dtype=bool))
            continue
        distance = newer_all - newer_below[pinned] if pinned > 0 else newer_all
        masks.append((ranked < pinned) | (warm & (distance < window)))
    return masks


def pinned_lru_step_hits(
    routes: NDArray[np.integer],
    experts: int,
    rankings: NDArray[np.int64],
    pinned: NDArray[np.integer] | list[int],
    window: NDArray[np.integer] | list[int],
) -> StepHits:
    """The recipe engine's cache over (steps, layers, top_k): per layer `pinned[l]` experts by `rankings[l]`
    (hottest first) resident for good, the other `window[l]` slots LRU."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, layers, _ = routes.shape
    hits = np.zeros((steps, layers), dtype=np.int16)
    for index in range(layers):
        mask = pinned_lru_masks(
            routes[:, index, :], experts, rankings[index], [(int(pinned[index]), int(window[index]))]
        )
        hits[:, index] = mask[0].sum(axis=1)
    return StepHits(hits)


def exl3_static(routes: NDArray[np.integer], experts: int, cpu: NDArray[np.bool_]) -> StepHits:
    """A fixed placement: cpu[layer, expert] True where the expert lives on the CPU worker."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    layers = routes.shape[1]
    on_gpu = ~cpu[np.arange(layers)[None, :, None], routes]
    return StepHits(on_gpu.sum(axis=2).astype(np.int16))


def static_cpu_mask(
    counts: NDArray[np.integer] | NDArray[np.floating], cpu_experts: NDArray[np.integer]
) -> NDArray[np.bool_]:
    """ExLlamaV3's static split (`load_cpu_split`): each layer's experts ordered by count, hottest first, by a
    stable sort on -count (among equal counts the lower id stays on the GPU), and the last k on the CPU."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    layers, experts = counts.shape
    cpu = np.zeros((layers, experts), dtype=bool)
    for index in range(layers):
        order = np.lexsort((np.arange(experts), -np.asarray(counts[index], dtype=np.float64)))
        k = int(cpu_experts[index])
        if k:
            cpu[index, order[experts - k :]] = True
    return cpu


def _sweep_points(steps: int, interval: int, generation: int | None) -> list[tuple[int, bool]]:
    """`sweep_triggers` for a trace of one-token steps, each a forward pass, in generations of `generation`
    steps (None: the queue drains after every step, the most dynamic placement can be)."""
    drains = None if generation is None else range(generation - 1, steps, generation)
    return sweep_triggers(steps, interval, drains)


def sweep_triggers(calls: int, interval: int, drained_after: Container[int] | None) -> list[tuple[int, bool]]:
    """(call, inline) for each sweep of `_split_swap_tick` / `run_pending_swap_sweeps` over `calls` forward
    passes, the queue draining after each call in `drained_after` (None: after every call).

    The first split layer counts a tick per forward pass, a prefill chunk or a decode step alike; at `interval`
    ticks a sweep is pending and runs when the generator's queue drains (`Generator.on_queue_drained`), or
    inline, before the call's routing is counted, once the ticks reach 4 x interval; either resets the count (an
    inline sweep's own call is then not counted). A sweep is returned as the call it precedes: an inline one as
    its own call, a drained one as the call after the drain.
    """
    points: list[tuple[int, bool]] = []
    tick = 0
    for call in range(calls):
        tick += 1
        if tick >= INLINE_SWEEP_INTERVALS * interval:
            points.append((call, True))
            tick = 0
            continue
        drains = drained_after is None or call in drained_after
        if tick >= interval and drains:
            points.append((call + 1, False))
            tick = 0
    return points


def sweep_layer(
    counts: NDArray[np.float64],
    cpu: NDArray[np.bool_],
    *,
    hysteresis: float,
    floor: float,
    budget: int,
) -> int:
    """One layer's turn in a sweep (`_split_sweep_layer`): swaps made in place in `cpu` (that layer's
    cpu[expert]), at most `budget`; the counts halve afterwards.

    GPU-resident ids sorted by ascending (count, id), CPU-resident ones by descending (count, id), paired in that
    order; each pair swaps while hot >= max(hysteresis x max(cold, 1), floor x sum of the counts / experts), and
    the first pair that fails ends the turn.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    ids = np.arange(len(counts))
    threshold_floor = floor * float(counts.sum()) / len(counts)
    head = np.flatnonzero(~cpu)
    tail = np.flatnonzero(cpu)
    head = head[np.lexsort((ids[head], counts[head]))]  # coldest GPU first, ties by lower id
    tail = tail[np.lexsort((-ids[tail], -counts[tail]))]  # hottest CPU first, ties by higher id
    pairs = min(len(head), len(tail))
    cold, hot = counts[head[:pairs]], counts[tail[:pairs]]
    passing = hot >= np.maximum(hysteresis * np.maximum(cold, 1.0), threshold_floor)
    run = int(np.argmin(passing)) if not passing.all() else pairs  # the leading run of passing pairs
    swapped = min(run, budget)
    if swapped:
        cpu[head[:swapped]] = True
        cpu[tail[:swapped]] = False
    counts *= 0.5
    return swapped


def exl3_dynamic(
    routes: NDArray[np.integer],
    experts: int,
    cpu_experts: NDArray[np.integer] | list[int],
    *,
    interval: int = SWAP_INTERVAL,
    hysteresis: float = SWAP_HYSTERESIS,
    floor: float = SWAP_FLOOR,
    max_swaps: int = SWAP_MAX,
    generation: int | None = None,
    start_cpu: NDArray[np.bool_] | None = None,
    sweeps: Sequence[int] | None = None,
) -> StepHits:
    """ExLlamaV3 1.4.6's dynamic CPU split, replayed over (steps, layers, top_k).

    As `block_sparse_mlp_cpu.py` at 499890c does it: the tail k router ids of each split layer start on the
    CPU (`start_cpu` overrides); every selection adds 1 to its router id's count (`moe_split_map` /
    `moe_split_issue_kernel`, in routing.cu); at each sweep (`_sweep_points`) the layers take turns in load
    order (`run_pending_swap_sweeps`): GPU-resident ids sorted by ascending (count, id), CPU-resident ones by
    descending (count, id), paired in that order, and each pair swaps while
        hot >= max(hysteresis x max(cold, 1), floor x sum of the layer's counts / experts)
    and the sweep's swaps stay under `max_swaps`; a layer's counts halve after its turn, and once the budget is
    spent the later layers get no turn (and keep their counts undecayed). A placement change therefore never
    follows a single miss; a CPU-resident expert is computed on the CPU until a sweep promotes it.

    `sweeps` replaces the trigger with the steps before which sweeps ran (a capture's record of them, which
    also counts prompt tokens one per step: the engine counts every routed token, prefill included).
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, layers, _ = routes.shape
    split = np.asarray(cpu_experts, dtype=np.int64)
    start = np.arange(experts)[None, :] >= (experts - split)[:, None]
    cpu = start if start_cpu is None else start_cpu.copy()
    hist = np.zeros((layers, experts), dtype=np.float64)
    offsets = (np.arange(layers, dtype=np.int64) * experts)[None, :, None]
    hits = np.zeros((steps, layers), dtype=np.int16)
    sweep_steps: list[int] = []
    swap_counts: list[int] = []
    turn_counts: list[int] = []
    split_layers = [index for index in range(layers) if 0 < split[index] < experts]
    position = 0
    points = _sweep_points(steps, interval, generation) if sweeps is None else [(int(p), False) for p in sweeps]
    for point, _inline in [*points, (steps, False)]:
        block = routes[position:point]
        if len(block):
            hits[position:point] = (~cpu[np.arange(layers)[None, :, None], block]).sum(axis=2)
            hist += np.bincount((block + offsets).ravel(), minlength=layers * experts).reshape(layers, experts)
        position = point
        if point >= steps:
            break
        budget = max_swaps
        made = turns = 0
        for index in split_layers:
            if budget <= 0:
                break  # this layer and the rest keep their counts (no turn, no decay)
            swapped = sweep_layer(hist[index], cpu[index], hysteresis=hysteresis, floor=floor, budget=budget)
            budget -= swapped
            made += swapped
            turns += 1
        sweep_steps.append(point)
        swap_counts.append(made)
        turn_counts.append(turns)
    return StepHits(
        hits,
        np.array(sweep_steps, dtype=np.int64),
        np.array(swap_counts, dtype=np.int64),
        cpu,
        np.array(turn_counts, dtype=np.int64),
    )


DEFAULT_RECENT = 1
DEFAULT_HALF_LIFE = 256.0


def growth_rate(half_life: float) -> float:
    """Decayed frequency's growth per step (a use's weight halves every `half_life` steps): one expression for
    this simulator and the GPU cache's runner, so both hold the same double."""
    return float(2.0 ** (1.0 / half_life))


def decayed_frequency(
    routes: NDArray[np.integer],
    experts: int,
    slots: NDArray[np.integer] | list[int],
    *,
    recent: int | NDArray[np.integer] = DEFAULT_RECENT,
    half_life: float = DEFAULT_HALF_LIFE,
    loop: bool | None = None,
) -> StepHits:
    """A decayed-frequency cache over (steps, layers, top_k), the same step model as LRU's.

    Each step looks its experts up, then every used expert is a candidate beside the resident ones; the layer
    keeps the experts used in its last `recent` steps and fills its other slots with the highest counts
    decayed by half every `half_life` steps (ties: the less recently used goes, then the lower id). A
    just-used expert whose count loses to every resident one is computed and not kept, so one stray selection
    cannot evict a hot expert. `slots` and `recent` are per layer or one value for all.

    loop=True runs the loop numba compiles (`_kernel`), loop=False the same rule vectorised over layers in
    numpy; None picks the loop when numba is there, else numpy (faster than uncompiled loops). Both give the
    same hits.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, layers, _ = routes.shape
    capacity = np.broadcast_to(np.asarray(slots, dtype=np.int64), (layers,)).copy()
    window = np.broadcast_to(np.asarray(recent, dtype=np.int64), (layers,)).copy()
    rate = np.full(layers, growth_rate(half_life))
    hits = np.zeros((steps, layers), dtype=np.int16)
    if compiled() if loop is None else loop:
        _run_kernel(routes, experts, capacity, window, rate[:1], 1.0, hits)
    else:
        _decayed_frequency_numpy(routes, experts, capacity, window, rate, hits)
    return StepHits(hits)


# Experts of the last `recent` steps outrank every count: their priority is lifted by this (counts are
# renormalised below 1e150).
_LIFT = 1e200
_RENORMALISE = 1e150


def _frequency_loop(
    routes: NDArray[np.int64],
    experts: int,
    capacity: NDArray[np.int64],
    window: NDArray[np.int64],
    rates: NDArray[np.float64],
    horizon: float,
    hits: NDArray[np.int16],
    score: NDArray[np.float64],
    growth: NDArray[np.float64],
    last: NDArray[np.int64],
    resident: NDArray[np.bool_],
    table: NDArray[np.int64],
    held: NDArray[np.int64],
    merit: NDArray[np.float64],
    found: NDArray[np.int64],
) -> None:
    """The rule of `decayed_frequency`, one layer at a time, in loops numba compiles (the scratch arrays come
    allocated by `_run_kernel` and are reset here for each layer, so the loop needs no numpy of its own).

    With one rate it is that cache. With several, each rate runs a shadow cache of its own and the served
    cache evicts by the counts of whichever shadow hit most lately (hits decayed by half every `horizon`
    steps): the half-life tunes itself to the traffic."""
    steps, layers, top_k = routes.shape
    shadows = rates.shape[0]
    caches = shadows + 1 if shadows > 1 else 1
    served = caches - 1
    keep = 2.0 ** (-1.0 / horizon)
    for layer in range(layers):
        for g in range(shadows):
            growth[g] = 1.0
            merit[g] = 0.0
            for expert in range(experts):
                score[g, expert] = 0.0
        for expert in range(experts):
            last[expert] = -(1 << 40)
        for cache in range(caches):
            held[cache] = 0
            for expert in range(experts):
                resident[cache, expert] = False
        leader = 0
        for step in range(steps):
            for cache in range(caches):
                found[cache] = 0
                for j in range(top_k):
                    if resident[cache, routes[step, layer, j]]:
                        found[cache] += 1
            hits[step, layer] = found[served]
            if shadows > 1:
                for g in range(shadows):
                    merit[g] = merit[g] * keep + found[g]
                    if merit[g] > merit[leader]:
                        leader = g
            for j in range(top_k):
                expert = routes[step, layer, j]
                last[expert] = step
                for g in range(shadows):
                    score[g, expert] += growth[g]
                for cache in range(caches):
                    if not resident[cache, expert]:
                        resident[cache, expert] = True
                        table[cache, held[cache]] = expert
                        held[cache] += 1
            for g in range(shadows):
                growth[g] *= rates[g]
                if growth[g] > _RENORMALISE:
                    for expert in range(experts):
                        score[g, expert] /= growth[g]
                    growth[g] = 1.0
            for cache in range(caches):
                row = cache if cache < shadows else leader
                while held[cache] > capacity[layer]:
                    worst = 0
                    worst_expert = table[cache, 0]
                    lifted = last[worst_expert] > step - window[layer]
                    worst_priority = score[row, worst_expert] + (_LIFT if lifted else 0.0)
                    for i in range(1, held[cache]):
                        expert = table[cache, i]
                        priority = score[row, expert] + (_LIFT if last[expert] > step - window[layer] else 0.0)
                        if priority < worst_priority or (
                            priority == worst_priority
                            and (
                                last[expert] < last[worst_expert]
                                or (last[expert] == last[worst_expert] and expert < worst_expert)
                            )
                        ):
                            worst, worst_expert, worst_priority = i, expert, priority
                    resident[cache, worst_expert] = False
                    held[cache] -= 1
                    table[cache, worst] = table[cache, held[cache]]


def _decayed_frequency_numpy(
    routes: NDArray[np.integer],
    experts: int,
    capacity: NDArray[np.int64],
    window: NDArray[np.int64],
    rate: NDArray[np.float64],
    hits: NDArray[np.int16],
) -> None:
    """The same rule vectorised over layers: each layer's slots are a row of expert ids (`experts` marks an
    empty slot, priority -inf), and a step ranks only that row and the step's own new experts."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, layers, top_k = routes.shape
    width = int(capacity.max())
    empty = experts
    table = np.full((layers, width), empty, dtype=np.int64)
    resident = np.zeros((layers, experts + 1), dtype=bool)
    score = np.zeros((layers, experts + 1), dtype=np.float64)
    score[:, empty] = -np.inf
    last = np.full((layers, experts + 1), -(1 << 40), dtype=np.int64)
    rows = np.arange(layers)[:, None]
    # A layer with fewer slots than the widest keeps its surplus in its first columns, always empty: the rows
    # are sorted ascending by priority, so the lowest entries land there.
    short = np.arange(width)[None, :] < (width - capacity)[:, None]
    growth = np.ones(layers)
    for step in range(steps):
        ids = routes[step].astype(np.int64)
        was = resident[rows, ids]
        hits[step] = was.sum(axis=1)
        score[rows, ids] += growth[:, None]
        last[rows, ids] = step
        growth *= rate
        if growth.max() > _RENORMALISE:
            big = growth > _RENORMALISE
            score[big, :empty] /= growth[big, None]
            growth[big] = 1.0
        candidates = np.concatenate([table, np.where(was, empty, ids)], axis=1)
        used = last[rows, candidates]
        priority = score[rows, candidates] + np.where(used > step - window[:, None], _LIFT, 0.0)
        priority[:, :width][short] = -np.inf
        order = np.lexsort((candidates, used, priority), axis=-1)
        table = candidates[rows, order[:, top_k:]]
        table[short] = empty
        resident.fill(False)
        resident[rows, table] = True
    resident[:, empty] = False


_KERNEL: list[Callable[..., None]] = []


def _kernel() -> Callable[..., None]:
    """`_frequency_loop` compiled by numba (cached on disk where the package's directory is writable), or the
    plain Python loop without numba: the same hits, about 100x slower."""
    if not _KERNEL:
        try:
            import numba  # optional: compiles the frequency caches; without it they run as plain Python
        except ImportError:
            _KERNEL.append(_frequency_loop)
        else:
            try:
                _KERNEL.append(numba.njit(nogil=True, cache=True)(_frequency_loop))
            except RuntimeError:  # no writable cache directory: compile in memory, once per process
                _KERNEL.append(numba.njit(nogil=True)(_frequency_loop))
    return _KERNEL[0]


def compiled() -> bool:
    """Whether the frequency caches run compiled (numba importable)."""
    return _kernel() is not _frequency_loop


def adaptive_frequency(
    routes: NDArray[np.integer],
    experts: int,
    slots: NDArray[np.integer] | list[int],
    *,
    recent: int | NDArray[np.integer] = 1,
    half_lives: Sequence[float] = (16.0, 64.0, 256.0, 1024.0, 4096.0),
    horizon: float = 1024.0,
) -> StepHits:
    """Decayed frequency with a self-tuned half-life: one shadow cache per half-life, and the served cache
    evicts by the counts of the shadow that hit most over the last `horizon` steps or so (hits decayed by half
    every `horizon` steps). Stationary traffic drifts it to long half-lives; shifting traffic to short ones."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, layers, _ = routes.shape
    capacity = np.broadcast_to(np.asarray(slots, dtype=np.int64), (layers,)).copy()
    window = np.broadcast_to(np.asarray(recent, dtype=np.int64), (layers,)).copy()
    rates = 2.0 ** (1.0 / np.asarray(half_lives, dtype=np.float64))
    hits = np.zeros((steps, layers), dtype=np.int16)
    _run_kernel(routes, experts, capacity, window, rates, float(horizon), hits)
    return StepHits(hits)


def _run_kernel(
    routes: NDArray[np.integer],
    experts: int,
    capacity: NDArray[np.int64],
    window: NDArray[np.int64],
    rates: NDArray[np.float64],
    horizon: float,
    hits: NDArray[np.int16],
) -> None:
    """`_kernel()` with its scratch arrays."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    top_k = routes.shape[2]
    shadows = len(rates)
    caches = shadows + 1 if shadows > 1 else 1
    _kernel()(
        np.ascontiguousarray(routes, dtype=np.int64),
        experts,
        capacity,
        window,
        rates,
        horizon,
        hits,
        np.zeros((shadows, experts)),
        np.ones(shadows),
        np.zeros(experts, dtype=np.int64),
        np.zeros((caches, experts), dtype=np.bool_),
        np.zeros((caches, int(capacity.max()) + top_k), dtype=np.int64),
        np.zeros(caches, dtype=np.int64),
        np.zeros(shadows),
        np.zeros(caches, dtype=np.int64),
    )


__all__ = [
    "SWAP_FLOOR",
    "SWAP_HYSTERESIS",
    "SWAP_INTERVAL",
    "SWAP_MAX",
    "StepHits",
    "adaptive_frequency",
    "compiled",
    "decayed_frequency",
    "exl3_dynamic",
    "exl3_static",
    "pinned_lru_masks",
    "pinned_lru_step_hits",
    "static_cpu_mask",
]
