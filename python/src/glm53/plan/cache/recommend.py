"""A recommendation, not just a plan: per engine, the expert-placement settings that hold up on the user's
trace and on stress scenarios derived from it (`trace_shapes.stress_scenarios`).

    recommend(trace, fraction) -> Recommendation

Candidates, each replayed by `policies` at the same GPU budget (a share of every layer's experts):

    engine      family              settings                                     runs today
    vllm        pinned LRU          the hottest p of each layer's slots pinned   yes: EXL3_PINNED_FRAC, the
                                    (p = 0 is plain LRU), rankings learned         rankings file
    exllamav3   static split        the coldest experts on the CPU, for good     yes: EXL3_MOE_CPU_SWAP=0 and
                                                                                   EXL3_MOE_CPU_SPLIT_STATS
    exllamav3   dynamic split       sweep interval, hysteresis, floor, swap cap  yes: EXL3_MOE_CPU_SWAP_*
    proposed    decayed frequency   recent steps kept, count half-life           no (see NEEDS)
    exl3-cache  pinned LRU, and     glm53's GPU expert cache in ExLlamaV3: the   yes: EXPERT_CACHE_POLICY,
                decayed frequency   pinned family, and the proposal's fixed      _PINNED, _RECENT, _HALF_LIFE
                                    half-lives (not its self-tuned one)

Each candidate is scored on every scenario by its hit rate minus plain LRU's there (the baseline that cannot
be misled by a ranking). ExLlamaV3's are scored by decode rate instead (`engine_cost.exl3_step_cost`: a
selection on a CPU-resident expert waits for the CPU worker, and every sweep and swap is paid), shown beside
plain LRU's priced alike, with its queue draining when a generation of `SERVED_GENERATION` tokens ends: its
sweeps trade hits against swaps, which points alone would not charge. Its scenarios are scored over at least
`SCORED_STEPS` (two requests; the part after the learning part repeated where it is shorter), since it sweeps
when a request ends.

The choice is robust first (`choose`): among the candidates whose worst scenario is within `TOLERANCE` of
the best worst case, the one with the best mean; where no candidate comes within a quarter point of LRU on
every scenario (the proposal's can miss it), the least maximum regret. Plain LRU is a vllm candidate, so the
recipe's engine is never recommended anything that loses to LRU on these scenarios by more than that.
ExLlamaV3's gains are taken over its own defaults (`over_stock`), which are a candidate too: its choice is the
setting whose worst scenario gains most over the stock engine, so never one slower than it there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from glm53.plan.cache.engine_cost import PolicyEngine, StepCost, default_exl3_cost
from glm53.plan.cache.policies import (
    SWAP_FLOOR,
    SWAP_HYSTERESIS,
    SWAP_INTERVAL,
    SWAP_MAX,
    StepHits,
    adaptive_frequency,
    compiled,
    decayed_frequency,
    exl3_dynamic,
    exl3_static,
    pinned_lru_masks,
    static_cpu_mask,
)
from glm53.plan.parallel import default_workers, layer_map
from glm53.plan.routing.shapes import stress_scenarios
from glm53.plan.routing.traces import RoutingTrace, rank_experts

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

Family = Literal["pinned-lru", "exl3-static", "exl3-dynamic", "decayed-frequency", "adaptive-frequency"]

# Among candidates whose worst scenario is within this share of the accesses of the best worst case, the best
# mean wins: robustness first, then the average.
TOLERANCE = 0.001
# Plain LRU's margin: a setting within it of LRU on every scenario is as safe as LRU (the target's 0.25 points).
LRU_GUARD = 0.0025
# Layers replayed when choosing (spread evenly over the trace's): the choice is one setting for all layers,
# and a dozen layers estimate it as well as all of them at a fraction of the time.
CHOICE_LAYERS = 12
# Steps of warm-up before a scenario's learning part: 4 sweeps of the slowest dynamic-split candidate.
WARM_UP_STEPS = 2048
# ExLlamaV3's cap on a sweep's swaps over all its split layers is 64 (EXL3_MOE_CPU_SWAP_MAX): about 1.5 experts a
# layer of GLM-5.3's 42. A candidate lifts it so that a sweep can follow popularity; its swaps are paid.
LARGE_SWAP_CAP = 1024
# ExLlamaV3's queue drains when a request ends, and only then runs a pending sweep (or inline at 4 x interval):
# requests of 2,048 generated tokens, one at a time, the length of the recipe's measured requests.
SERVED_GENERATION = 2048
# Steps ExLlamaV3's scenarios are scored over, at least: two served requests.
SCORED_STEPS = 2 * SERVED_GENERATION

NEEDS = {
    "vllm": "the recipe's engine keeps an LRU order per layer; it would need a decayed count per expert (one "
    "multiply-add per selection) and to evict the lowest count outside the last step's experts instead of the "
    "least recent, admitting a miss only when its count beats that victim's",
    "exllamav3": "ExLlamaV3 1.4.6 moves experts only at sweeps, between generations or every 4 x interval passes "
    "(a placement change mid-generation perturbs the output: the CPU and GPU kernels round differently), and a "
    "swap re-reads both experts from the checkpoint, which costs more than computing a miss on the CPU; a "
    "per-step cache would need promotion on a miss copied asynchronously from pinned host memory beside the "
    "other layers' work (as the recipe's engine fills its cache) and numerically matching kernels",
}


class Candidate(BaseModel):
    """One engine setting; the fields that do not apply to its family stay None."""

    model_config = ConfigDict(frozen=True)

    engine: PolicyEngine
    family: Family
    pinned_fraction: float | None = None
    interval: int | None = None
    hysteresis: float | None = None
    floor: float | None = None
    max_swaps: int | None = None
    recent: int | None = None
    half_life: float | None = None

    @property
    def runs_today(self) -> bool:
        return self.engine != "proposed"

    @property
    def label(self) -> str:
        if self.family == "pinned-lru":
            return "LRU" if not self.pinned_fraction else f"LRU, {self.pinned_fraction:.0%} pinned"
        if self.family == "exl3-static":
            return "static split"
        if self.family == "exl3-dynamic":
            cap = "" if self.max_swaps in (None, SWAP_MAX) else f" cap {self.max_swaps}"
            return f"dynamic split /{self.interval} x{self.hysteresis:g} floor {self.floor:g}{cap}"
        if self.family == "adaptive-frequency":
            return f"decayed frequency, self-tuned half-life, recent {self.recent}"
        return f"decayed frequency, half-life {self.half_life:g}, recent {self.recent}"

    def env(self, stats_file: str | None = None) -> dict[str, str]:
        """What the engine is given to run this setting (empty for a proposal no engine reads)."""
        if self.family == "pinned-lru":
            return {"EXL3_PINNED_FRAC": f"{self.pinned_fraction or 0.0:.4f}"}
        if self.family == "exl3-static":
            env = {"EXL3_MOE_CPU_SWAP": "0"}
            if stats_file is not None:
                env["EXL3_MOE_CPU_SPLIT_STATS"] = stats_file
            return env
        if self.family == "exl3-dynamic":
            return {
                "EXL3_MOE_CPU_SWAP": "1",
                "EXL3_MOE_CPU_SWAP_INTERVAL": str(self.interval),
                "EXL3_MOE_CPU_SWAP_HYST": f"{self.hysteresis:g}",
                "EXL3_MOE_CPU_SWAP_FLOOR": f"{self.floor:g}",
                "EXL3_MOE_CPU_SWAP_MAX": str(self.max_swaps),
            }
        return {}


LRU = Candidate(engine="vllm", family="pinned-lru", pinned_fraction=0.0)
RECIPE = Candidate(engine="vllm", family="pinned-lru", pinned_fraction=0.2)
EXL3_DEFAULT = Candidate(
    engine="exllamav3",
    family="exl3-dynamic",
    interval=SWAP_INTERVAL,
    hysteresis=SWAP_HYSTERESIS,
    floor=SWAP_FLOOR,
    max_swaps=SWAP_MAX,
)


def _pinned_lru_candidates() -> list[Candidate]:
    return [Candidate(engine="vllm", family="pinned-lru", pinned_fraction=p) for p in (0.0, 0.1, 0.2, 0.4, 0.6)]


def _exl3_candidates() -> list[Candidate]:
    dynamic = [
        Candidate(
            engine="exllamav3",
            family="exl3-dynamic",
            interval=interval,
            hysteresis=hysteresis,
            floor=floor,
            max_swaps=max_swaps,
        )
        for interval in (8, 32, 128, 512)
        for hysteresis in (2.0, 4.0)
        for floor in (0.0, SWAP_FLOOR)
        for max_swaps in (SWAP_MAX, LARGE_SWAP_CAP)
    ]
    return [Candidate(engine="exllamav3", family="exl3-static"), *dynamic]


def _proposed_candidates() -> list[Candidate]:
    fixed = [
        Candidate(engine="proposed", family="decayed-frequency", recent=1, half_life=half_life)
        for half_life in (64.0, 256.0, 1024.0)
    ]
    return [Candidate(engine="proposed", family="adaptive-frequency", recent=1), *fixed]


# The half-lives the GPU expert cache is chosen from: the proposal's fixed ones, and two short ones that follow a
# moving hot set closely enough to stay at or above plain LRU where the longer ones fall behind it (a sliding
# ranking), so the robust choice can keep a frequency policy there instead of falling back to LRU.
EXPERT_CACHE_HALF_LIVES = (16.0, 32.0, 64.0, 256.0, 1024.0)


def _expert_cache_candidates() -> list[Candidate]:
    """glm53's GPU expert cache (pkgs/exllamav3/expert-cache/policy.cuh runs both families)."""
    pinned = [candidate.model_copy(update={"engine": "exl3-cache"}) for candidate in _pinned_lru_candidates()]
    frequency = [
        Candidate(engine="exl3-cache", family="decayed-frequency", recent=1, half_life=half_life)
        for half_life in EXPERT_CACHE_HALF_LIVES
    ]
    return [*pinned, *frequency]


@dataclass(frozen=True)
class PolicyPool:
    """How one engine's policies are scored. `sweeps`: its placement moves only at sweeps between generations
    (ExLlamaV3's), so its scenarios run long enough for several, are scored where they have settled, are priced
    in decode rate and judged against the engine's stock defaults. `needs`: what the recipe's engine lacks to
    run the pool's policies (the proposal only)."""

    make: Callable[[], list[Candidate]]
    sweeps: bool = False
    needs: str | None = None


POLICY_POOLS: dict[PolicyEngine, PolicyPool] = {
    "vllm": PolicyPool(_pinned_lru_candidates),
    "exllamav3": PolicyPool(_exl3_candidates, sweeps=True),
    "proposed": PolicyPool(_proposed_candidates, needs=NEEDS["vllm"]),
    "exl3-cache": PolicyPool(_expert_cache_candidates),
}


def candidates(engine: PolicyEngine) -> list[Candidate]:
    return POLICY_POOLS[engine].make()


def replay(
    candidate: Candidate,
    trace: RoutingTrace,
    slots: int,
    learn_steps: int,
    *,
    layer_share: float = 1.0,
    generation: int | None = SERVED_GENERATION,
) -> StepHits:
    """`candidate` over the whole trace with `slots` GPU experts per layer; what needs statistics (rankings,
    a stats file) learns them on the first `learn_steps` steps only. `layer_share`: the share of the model's
    layers the trace holds; ExLlamaV3's swap cap is one budget for a sweep over every layer, so a sample of
    the layers gets that share of it. `generation`: the steps between ExLlamaV3's queue drains (None: after
    every step, the most dynamic its placement can be)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    experts, layers = trace.experts, len(trace.layers)
    if candidate.family == "adaptive-frequency":
        return adaptive_frequency(trace.routes, experts, [slots] * layers, recent=candidate.recent or 1)
    if candidate.family == "decayed-frequency":
        return decayed_frequency(
            trace.routes,
            experts,
            [slots] * layers,
            recent=candidate.recent or 1,
            half_life=candidate.half_life or 256.0,
        )
    if candidate.family == "exl3-dynamic":
        return exl3_dynamic(
            trace.routes,
            experts,
            [experts - slots] * layers,
            interval=candidate.interval or SWAP_INTERVAL,
            hysteresis=candidate.hysteresis if candidate.hysteresis is not None else SWAP_HYSTERESIS,
            floor=candidate.floor if candidate.floor is not None else SWAP_FLOOR,
            max_swaps=max(1, round((candidate.max_swaps or SWAP_MAX) * layer_share)),
            generation=generation,
        )
    counts = learned_counts(trace, learn_steps)
    if candidate.family == "exl3-static":
        return exl3_static(trace.routes, experts, static_cpu_mask(counts, np.full(layers, experts - slots)))
    return pinned_family(trace, slots, learn_steps, [candidate.pinned_fraction or 0.0])[0]


def pinned_family(trace: RoutingTrace, slots: int, learn_steps: int, fractions: Sequence[float]) -> list[StepHits]:
    """Pinned LRU at several pinned shares in one pass per layer (the stack distances are shared)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    experts, layers = trace.experts, len(trace.layers)
    counts = learned_counts(trace, learn_steps)
    splits = [(round(p * slots), slots - round(p * slots)) for p in fractions]
    hits = [np.zeros((trace.steps, layers), dtype=np.int16) for _ in fractions]
    for index in range(layers):
        masks = pinned_lru_masks(trace.routes[:, index, :], experts, rank_experts(counts[index]), splits)
        for out, mask in zip(hits, masks, strict=True):
            out[:, index] = mask.sum(axis=1)
    return [StepHits(h) for h in hits]


def pinned_share_rates(recommendation: Recommendation, trace: RoutingTrace, fraction: float, seed: int) -> list[float]:
    """One pinned share's held-out hit rate on each of the recommendation's scenarios (made from `trace` at
    `seed`), replayed on the same layers and split as its candidates were: what the plan sets its choice beside."""
    sample = subset(trace, layer_sample(len(trace.layers)))
    cut = recommendation.learn_steps
    rates = []
    for scenario in stress_scenarios(sample, seed, start=cut).values():
        hits = pinned_family(scenario, recommendation.slots, cut, [fraction])[0]
        rates.append(hits.total(cut) / ((scenario.steps - cut) * len(sample.layers) * sample.top_k))
    return rates


def learned_counts(trace: RoutingTrace, learn_steps: int) -> NDArray[np.int64]:
    return trace.slice(0, max(1, learn_steps)).counts()


class ScenarioScore(BaseModel):
    model_config = ConfigDict(frozen=True)

    scenario: str
    hit_rate: float
    lru_hit_rate: float
    # Where the engine is scored by decode rate: the candidate's and plain LRU's, priced alike.
    tokens_per_s: float | None = None
    lru_tokens_per_s: float | None = None

    @property
    def gain(self) -> float:
        """Points of hit rate over plain LRU; where priced, the decode rate's relative gain over LRU's."""
        if self.tokens_per_s is not None and self.lru_tokens_per_s:
            return self.tokens_per_s / self.lru_tokens_per_s - 1.0
        return self.hit_rate - self.lru_hit_rate


class EngineChoice(BaseModel):
    """The chosen setting of one engine (or of the proposal), with its score on every scenario."""

    model_config = ConfigDict(frozen=True)

    engine: PolicyEngine
    choice: Candidate
    label: str
    measure: Literal["hit rate", "decode rate"] = "hit rate"  # what the gains are of (ScenarioScore.gain)
    scores: list[ScenarioScore]
    worst_gain: float
    mean_gain: float
    considered: int
    scored_steps: int = 0  # after the learning part, in every scenario
    stock_scores: list[ScenarioScore] = []  # ExLlamaV3's: its defaults on the same scenarios
    needs: str | None = None

    @property
    def worst_over_stock(self) -> float | None:
        """The least relative decode-rate gain over the engine's defaults across the scenarios (None: unpriced)."""
        return min(over_stock(self.scores, self.stock_scores)) if self.stock_scores else None


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)

    fraction: float
    slots: int
    steps: int
    learn_steps: int
    layers_replayed: list[int]
    scenarios: list[str]
    engines: list[EngineChoice]

    def engine(self, name: PolicyEngine) -> EngineChoice:
        return next(choice for choice in self.engines if choice.engine == name)


class _ScenarioTask(NamedTuple):
    engine: PolicyEngine
    name: str
    pool: list[Candidate]
    scenario: RoutingTrace
    slots: int
    start: int  # scored from this step on
    layer_share: float
    accesses: int
    cost: StepCost | None  # prices the engine's decode rate; None: scored by hit rate
    generation: int | None


class _Rate(NamedTuple):
    hit_rate: float
    tokens_per_s: float | None


def _score_scenario(task: _ScenarioTask) -> tuple[_Rate, dict[Candidate, _Rate]]:
    """Plain LRU's rate on one scenario, and each candidate's, scored from step `start` on."""
    start, share = task.start, task.layer_share

    def rate(hits: StepHits) -> _Rate:
        priced = None
        if task.cost is not None:
            priced = task.cost.replay_tokens_per_s(hits, start, layer_share=share)
        return _Rate(hits.total(start) / task.accesses, priced)

    pool = task.pool
    fractions = sorted({0.0, *(c.pinned_fraction or 0.0 for c in pool if c.family == "pinned-lru")})
    family = {
        p: rate(hits)
        for p, hits in zip(fractions, pinned_family(task.scenario, task.slots, start, fractions), strict=True)
    }
    rates: dict[Candidate, _Rate] = {}
    for candidate in pool:
        if candidate.family == "pinned-lru":  # whichever engine's pool it is in: one pass for the family
            rates[candidate] = family[candidate.pinned_fraction or 0.0]
        else:
            hits = replay(candidate, task.scenario, task.slots, start, layer_share=share, generation=task.generation)
            rates[candidate] = rate(hits)
    return family[0.0], rates


def choose(gains: list[list[float]]) -> int:
    """The index of the robust choice among candidates' gains over a baseline (plain LRU, or for ExLlamaV3 its
    defaults), one list per candidate (one value per scenario).

    Where some candidate stays within `LRU_GUARD` of the baseline on every scenario: among the candidates whose
    worst scenario is within `TOLERANCE` of the best worst case, the best mean. Where none can (the proposal,
    which has no plain LRU among its settings, can fall far below it on a sliding ranking), the worst case says
    little (every setting is about as bad there): the least maximum regret, the distance to the best candidate
    of each scenario, then the best mean."""
    worst = [min(values) for values in gains]
    means = [sum(values) / len(values) for values in gains]
    if max(worst) >= -LRU_GUARD:
        eligible = [i for i, value in enumerate(worst) if value >= max(worst) - TOLERANCE]
        return max(eligible, key=lambda i: means[i])
    best = [max(values[s] for values in gains) for s in range(len(gains[0]))]
    regret = [max(b - v for b, v in zip(best, values, strict=True)) for values in gains]
    eligible = [i for i, value in enumerate(regret) if value <= min(regret) + TOLERANCE]
    return max(eligible, key=lambda i: means[i])


def over_stock(rows: Sequence[ScenarioScore], stock: Sequence[ScenarioScore]) -> list[float]:
    """Each scenario's relative decode-rate gain over the stock setting's."""
    return [
        (row.tokens_per_s or 0.0) / base.tokens_per_s - 1.0 if base.tokens_per_s else 0.0
        for row, base in zip(rows, stock, strict=True)
    ]


def warmed(trace: RoutingTrace, learn_steps: int, steps: int = WARM_UP_STEPS) -> RoutingTrace:
    """The trace after its own learning part repeated to at least `steps` steps: a placement that moves only at
    sweeps (ExLlamaV3's, every 512 steps at the slowest candidate) is then scored where it has settled, as it
    would be while serving, not while it still climbs out of its start; counts over the repeats rank experts
    as the learning part alone does."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    repeats = -(-steps // learn_steps)
    head = np.tile(trace.routes[:learn_steps], (repeats, 1, 1))
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, np.concatenate([head, trace.routes]))


def lengthened(trace: RoutingTrace, start: int, steps: int) -> RoutingTrace:
    """The trace with its part from `start` on repeated until that part has at least `steps` steps."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    tail = trace.routes[start:]
    if len(tail) >= steps or not len(tail):
        return trace
    repeats = -(-steps // len(tail))
    routes = np.concatenate([trace.routes[:start], np.tile(tail, (repeats, 1, 1))])
    return RoutingTrace(trace.layers, trace.experts, trace.top_k, routes)


def layer_sample(layers: int, limit: int = CHOICE_LAYERS) -> list[int]:
    """Up to `limit` layer indices spread evenly over `layers`."""
    if layers <= limit:
        return list(range(layers))
    return sorted({round(i * (layers - 1) / (limit - 1)) for i in range(limit)})


def subset(trace: RoutingTrace, indices: Sequence[int]) -> RoutingTrace:
    picked = list(indices)
    return RoutingTrace(tuple(trace.layers[i] for i in picked), trace.experts, trace.top_k, trace.routes[:, picked, :])


def recommend(
    trace: RoutingTrace,
    fraction: float,
    *,
    engines: Sequence[PolicyEngine] = ("vllm", "exllamav3", "proposed"),
    seed: int = 0,
    layer_limit: int = CHOICE_LAYERS,
    learn_steps: int | None = None,
    workers: int | None = None,
    exl3_cost: StepCost | None = None,
    generation: int | None = SERVED_GENERATION,
) -> Recommendation:
    """Choose each engine's setting at a GPU budget of `fraction` of every layer's experts (see the module's
    docstring). The scenarios split at `learn_steps` (default the midpoint): the steps before learn, the rest
    is scored, and the stress scenarios change from there. The proposal is left out where numba is missing
    (its uncompiled loops would take minutes). `exl3_cost` prices ExLlamaV3's candidates (default: GLM-5.3's
    experts on the recipe's rig, `engine_cost.exl3_step_cost`); `generation`, the steps between its queue's
    drains."""
    sweeping = any(POLICY_POOLS[engine].sweeps for engine in engines)
    if sweeping and exl3_cost is None:
        exl3_cost = default_exl3_cost(trace.top_k)

    picked = layer_sample(len(trace.layers), layer_limit)
    sample = subset(trace, picked)
    slots = max(trace.top_k, min(trace.experts, round(fraction * trace.experts)))
    cut = sample.steps // 2 if learn_steps is None else min(max(1, learn_steps), sample.steps - 1)
    plain = stress_scenarios(sample, seed, start=cut)
    # ExLlamaV3's sweeps wait for a queue drain (a request's end) or 4 x interval passes: its scenarios run
    # long enough for several, the part after the learning part repeated before they change it.
    served = stress_scenarios(lengthened(sample, cut, SCORED_STEPS), seed, start=cut) if sweeping else {}
    pools = {engine: candidates(engine) for engine in engines if engine != "proposed" or compiled()}
    # One task per engine and scenario; they are independent, so a large trace spreads over processes.
    tasks: list[_ScenarioTask] = []
    for engine, pool in pools.items():
        # ExLlamaV3's placement moves only at sweeps: scored where it has settled (`warmed`); a cache settles
        # within its slots' worth of misses, so the others keep the scenario as it is.
        sweeps = POLICY_POOLS[engine].sweeps
        for name, scenario in (served if sweeps else plain).items():
            held_out = scenario.steps - cut
            scenario = warmed(scenario, cut) if sweeps else scenario
            cost = exl3_cost if sweeps else None
            # The replayed layers stand for the model's: their share of its swap cap and of its decode time.
            replayed, of = len(picked), len(trace.layers)
            share = cost.layer_share(replayed, of) if cost is not None else replayed / of
            start = scenario.steps - held_out
            accesses = held_out * len(picked) * sample.top_k
            tasks.append(_ScenarioTask(engine, name, pool, scenario, slots, start, share, accesses, cost, generation))
    work = sample.steps * len(picked) * len(tasks)
    results = layer_map(_score_scenario, tasks, default_workers(work) if workers is None else workers)
    choices = []
    for engine, pool in pools.items():
        rates: dict[tuple[Candidate, str], _Rate] = {}
        lru: dict[str, _Rate] = {}
        for task, (baseline, scored_rates) in zip(tasks, results, strict=True):
            if task.engine == engine:
                lru[task.name] = baseline
                rates.update({(candidate, task.name): rate for candidate, rate in scored_rates.items()})
        scored = [
            (
                candidate,
                [
                    ScenarioScore(
                        scenario=name,
                        hit_rate=rates[(candidate, name)].hit_rate,
                        lru_hit_rate=lru[name].hit_rate,
                        tokens_per_s=rates[(candidate, name)].tokens_per_s,
                        lru_tokens_per_s=lru[name].tokens_per_s,
                    )
                    for name in plain
                ],
            )
            for candidate in pool
        ]
        if POLICY_POOLS[engine].sweeps:
            # Judged against the stock engine, robust first: the largest worst-scenario gain over the engine's
            # defaults (which are among the candidates, so never below them), then the best mean.
            stock = next(rows for candidate, rows in scored if candidate == EXL3_DEFAULT)
            candidate, rows = scored[choose([over_stock(rows, stock) for _, rows in scored])]
        else:
            stock = []
            candidate, rows = scored[choose([[row.gain for row in rows] for _, rows in scored])]
        gains = [row.gain for row in rows]
        choices.append(
            EngineChoice(
                engine=engine,
                choice=candidate,
                label=candidate.label,
                measure="decode rate" if POLICY_POOLS[engine].sweeps else "hit rate",
                scores=rows,
                worst_gain=min(gains),
                mean_gain=sum(gains) / len(gains),
                considered=len(pool),
                scored_steps=next(task.scenario.steps - task.start for task in tasks if task.engine == engine),
                stock_scores=stock,
                needs=POLICY_POOLS[engine].needs,
            )
        )
    return Recommendation(
        fraction=fraction,
        slots=slots,
        steps=trace.steps,
        learn_steps=cut,
        layers_replayed=[trace.layers[i] for i in picked],
        scenarios=list(plain),
        engines=choices,
    )


__all__ = [
    "CHOICE_LAYERS",
    "EXL3_DEFAULT",
    "EXPERT_CACHE_HALF_LIVES",
    "LRU",
    "NEEDS",
    "RECIPE",
    "SCORED_STEPS",
    "SERVED_GENERATION",
    "TOLERANCE",
    "Candidate",
    "EngineChoice",
    "Recommendation",
    "ScenarioScore",
    "candidates",
    "choose",
    "layer_sample",
    "learned_counts",
    "lengthened",
    "over_stock",
    "pinned_family",
    "pinned_share_rates",
    "recommend",
    "replay",
    "subset",
]
