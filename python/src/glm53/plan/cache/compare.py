"""`plan simulate`: four expert-cache policies replayed over the held-out part of a routing trace.

    (a) uniform LRU      the same slots per layer, all LRU
    (b) recipe           the same slots per layer, the hottest 20% of them pinned, the rest LRU
    (c) planned          slots split across layers by DP, each layer's pinned/LRU split learned and hedged
                         against drift (cache_plan.hedged_split)
    (d) Belady MIN       the optimum for (c)'s slots per layer: no policy with that allocation hits more

Rankings and curves are learned on the first part of the trace only; every policy is scored on the rest, each
layer's cache starting empty (pinned experts loaded up front). Drift scenarios replay the trace with its expert
ids relabelled from a step on (traces.drift_trace), each re-learned on its own first part, through (b) and (c).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.plan.cache.allocation import uniform_split
from glm53.plan.cache.decode_cost import CostModel, build_cost_model, read_probe_bandwidth
from glm53.plan.cache.engine_cost import engine_costs
from glm53.plan.cache.hit_curves import LayerCurves
from glm53.plan.cache.replay import belady_hits, pinned_lru_hits
from glm53.plan.cache.slots import RECIPE_PINNED_FRACTION, learn_from_trace, split_from_curves
from glm53.plan.cache.targets import TargetRow, evaluate_trace
from glm53.plan.inputs.kv import derive_kv
from glm53.plan.inputs.model import load_architecture
from glm53.plan.parallel import cpu_seconds, default_workers, layer_map
from glm53.plan.routing.traces import RoutingTrace, drift_trace

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    _ScoreTask = tuple[NDArray[np.int16], int, NDArray[np.int64], list[tuple[int, int]], list[int]]

POLICIES = {
    "a": "uniform LRU",
    "b": "recipe: 20% pinned",
    "c": "planned",
    "d": "Belady MIN",
}

Progress = Callable[[str, int, int], None]


class PolicyResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    policy: str
    label: str
    hits: int
    accesses: int
    hit_rate: float
    tokens_per_s: float | None = None
    pcie_bytes_per_token: float | None = None


class DriftResult(BaseModel):
    """One drift scenario at one budget: the trace with popularity shifted at `at` (share of the steps) by
    `strength` (share of each layer's experts re-permuted), re-learned and re-planned on its own first part."""

    model_config = ConfigDict(frozen=True)

    at: float
    strength: float
    recipe_hit_rate: float
    planned_hit_rate: float

    @property
    def gain(self) -> float:
        return self.planned_hit_rate - self.recipe_hit_rate


class BudgetResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    fraction: float
    slots: int
    slots_per_layer_planned: list[int]
    pinned_per_layer_planned: list[int]
    results: list[PolicyResult]
    seconds: float
    drift: list[DriftResult] = []

    def result(self, policy: str) -> PolicyResult:
        return next(r for r in self.results if r.policy == policy)

    @property
    def planned_gain_over_recipe(self) -> float:
        return self.result("c").hit_rate - self.result("b").hit_rate

    @property
    def worst_drift_gain(self) -> float | None:
        """The planned policy's worst result against the recipe over the drift scenarios (None without any)."""
        return min((d.gain for d in self.drift), default=None)

    @property
    def planned_gap_to_min(self) -> float:
        return self.result("d").hit_rate - self.result("c").hit_rate


class ComparisonReport(BaseModel):
    format: str = "glm53-simulation"
    version: int = 1
    trace: str
    layers: int
    experts: int
    top_k: int
    steps: int
    learned_steps: int
    scored_steps: int
    learn_seconds: float
    total_seconds: float
    cpu_seconds: float  # CPU time of this process and its workers: the wall time of one idle core
    workers: int = 1
    budgets: list[BudgetResult]
    cost_model: CostModel | None = None
    drift_scenarios: list[tuple[float, float]] = []
    # The engines' own policies (`targets.evaluate_trace`): each engine's recommendation and defaults, priced as
    # that engine pays misses where the trace has GLM-5.3-Flash's shape.
    engines: list[TargetRow] = []
    engine_costs: list[str] = []


def _noop(stage: str, done: int, total: int) -> None:
    return None


def _score_layer(task: _ScoreTask) -> tuple[list[int], list[int], float, list[float]]:
    """One layer: LRU-type hits for every split in one pass, then MIN at each capacity (with timings)."""
    routes, experts, ranking, splits, capacities = task
    started = time.process_time()
    lru = pinned_lru_hits(routes, experts, ranking, splits)
    lru_seconds = time.process_time() - started
    optimum, seconds = [], []
    for capacity in capacities:
        started = time.process_time()
        optimum.append(belady_hits(routes, capacity, experts))
        seconds.append(time.process_time() - started)
    return lru, optimum, lru_seconds, seconds


def parse_budgets(text: str, *, flag: str = "--budgets") -> list[float]:
    """'0.08,0.17,0.33': GPU slot budgets as fractions of all experts."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise BadInput(f"{flag} {text!r}: expected fractions like 0.08,0.17,0.33") from exc


def trace_cost_model(
    trace: RoutingTrace, *, tensor_parallel_size: int, bandwidth_path: Path | None = None
) -> CostModel | None:
    """The cost model of the published architecture, when the trace routes like it (same experts and top-k);
    None otherwise, and the report then has hit rates without tokens/s."""
    model = load_architecture()
    if (trace.experts, trace.top_k) != (model.n_routed_experts, model.num_experts_per_tok):
        return None
    return build_cost_model(
        model,
        derive_kv(model, tensor_parallel_size),
        tensor_parallel_size=tensor_parallel_size,
        bandwidth=read_probe_bandwidth(bandwidth_path) if bandwidth_path else None,
    )


def add_engine_policies(report: ComparisonReport, trace: RoutingTrace, *, seed: int = 0) -> ComparisonReport:
    """The report with each engine's recommended setting and defaults replayed over the same held-out part."""
    costs = engine_costs(trace.experts, trace.top_k)
    rows = evaluate_trace(
        trace,
        report.learned_steps,
        name=report.trace,
        seed=seed,
        fractions=[budget.fraction for budget in report.budgets],
        costs=costs,
    )
    notes = [f"{engine}: {'; '.join(cost.assumptions)}" for engine, cost in (costs or {}).items()]
    return report.model_copy(update={"engines": rows, "engine_costs": notes})


def compare_policies(
    trace: RoutingTrace,
    fractions: Sequence[float] = (0.08, 0.17, 0.33),
    *,
    learn_fraction: float = 0.2,
    cost: CostModel | None = None,
    min_slots: int | None = None,
    source: str = "",
    progress: Progress = _noop,
    workers: int | None = None,
    drift: Sequence[tuple[float, float]] = (),
    drift_seed: int = 0,
) -> ComparisonReport:
    """Learn on the first `learn_fraction`, then score the four policies on the rest at each budget.

    Layers are independent, so with `workers` > 1 (default: every allowed CPU for a large trace) they are
    spread over that many processes.
    """
    started = time.perf_counter()
    cpu_started = cpu_seconds()
    layers, experts = len(trace.layers), trace.experts
    minimum = trace.top_k if min_slots is None else min_slots
    workers = default_workers(trace.steps * layers) if workers is None else workers
    budgets = _budget_slots(fractions, layers, experts, minimum)
    learn, score = trace.split(learn_fraction)
    progress("learning", 0, layers)
    rankings, curves = learn_from_trace(learn, workers=workers)
    learned = (rankings, curves)
    progress("learning", layers, layers)
    learn_seconds = time.perf_counter() - started
    uniform = [uniform_split(b, layers, experts) for b in budgets]
    planned = [split_from_curves(curves, b, min_slots=minimum) for b in budgets]
    tasks = _score_tasks(score, rankings, uniform, planned)
    scored = layer_map(_score_layer, tasks, workers, lambda done: progress("simulating", done, layers))
    accesses = score.steps * score.top_k
    totals, budget_seconds = _sum_scores(scored, len(budgets))
    drift_rates = [
        _drift_scenario(trace, scenario, budgets, uniform, learn_fraction, minimum, workers, drift_seed, learned)
        for scenario in drift
    ]
    results: list[BudgetResult] = []
    for i, (fraction, slots) in enumerate(zip(fractions, budgets, strict=True)):
        rows = []
        for policy, label in POLICIES.items():
            rate = totals[(i, policy)] / (accesses * layers)
            rows.append(
                PolicyResult(
                    policy=policy,
                    label=label,
                    hits=totals[(i, policy)],
                    accesses=accesses * layers,
                    hit_rate=rate,
                    tokens_per_s=cost.tokens_per_s(rate) if cost else None,
                    pcie_bytes_per_token=cost.pcie_bytes_per_token(rate) if cost else None,
                )
            )
        results.append(
            BudgetResult(
                fraction=fraction,
                slots=slots,
                slots_per_layer_planned=[p + w for p, w in planned[i]],
                pinned_per_layer_planned=[p for p, _ in planned[i]],
                results=rows,
                seconds=budget_seconds[i],
                drift=[
                    DriftResult(at=at, strength=strength, recipe_hit_rate=rates[i][0], planned_hit_rate=rates[i][1])
                    for (at, strength), rates in zip(drift, drift_rates, strict=True)
                ],
            )
        )
    return ComparisonReport(
        trace=source,
        layers=layers,
        experts=experts,
        top_k=trace.top_k,
        steps=trace.steps,
        learned_steps=learn.steps,
        scored_steps=score.steps,
        learn_seconds=learn_seconds,
        total_seconds=time.perf_counter() - started,
        cpu_seconds=cpu_seconds() - cpu_started,
        workers=workers,
        budgets=results,
        cost_model=cost,
        drift_scenarios=[(float(at), float(strength)) for at, strength in drift],
    )


def _budget_slots(fractions: Sequence[float], layers: int, experts: int, minimum: int) -> list[int]:
    """Each budget (a fraction of all experts) in slots; refuses one outside (0, 1] or below `minimum` a layer."""
    budgets: list[int] = []
    for fraction in fractions:
        if not 0.0 < fraction <= 1.0:
            raise BadInput(f"budget {fraction} must be a fraction of all experts in (0, 1]")
        slots = round(fraction * layers * experts)
        if slots < minimum * layers:
            raise BadInput(
                f"a budget of {fraction:.1%} ({slots} slots) leaves fewer than {minimum} slots per layer",
                fix=f"use at least {minimum * layers / (layers * experts):.1%}",
            )
        budgets.append(slots)
    return budgets


def _score_tasks(
    score: RoutingTrace,
    rankings: NDArray[np.int64],
    uniform: list[list[int]],
    planned: list[list[tuple[int, int]]],
) -> list[_ScoreTask]:
    """One task a layer: its held-out routes and, at each budget, plain LRU, the recipe's split and the plan's."""
    tasks: list[_ScoreTask] = []
    for index in range(len(score.layers)):
        splits: list[tuple[int, int]] = []
        for i in range(len(uniform)):
            slots = uniform[i][index]
            pinned = round(RECIPE_PINNED_FRACTION * slots)
            splits += [(0, slots), (pinned, slots - pinned), planned[i][index]]
        capacities = [sum(planned[i][index]) for i in range(len(uniform))]
        tasks.append((score.routes[:, index, :], score.experts, rankings[index], splits, capacities))
    return tasks


def _sum_scores(scored: Sequence[Any], budgets: int) -> tuple[dict[tuple[int, str], int], list[float]]:
    """Hits per (budget, policy) summed over the layers, and each budget's simulation seconds."""
    totals = {(i, p): 0 for i in range(budgets) for p in "abcd"}
    budget_seconds = [0.0] * budgets
    for lru, optimum, lru_seconds, seconds in scored:
        for i in range(budgets):
            totals[(i, "a")] += lru[3 * i]
            totals[(i, "b")] += lru[3 * i + 1]
            totals[(i, "c")] += lru[3 * i + 2]
            totals[(i, "d")] += optimum[i]
            budget_seconds[i] += lru_seconds / budgets + seconds[i]
    return totals, budget_seconds


def _drift_scenario(
    trace: RoutingTrace,
    scenario: tuple[float, float],
    budgets: list[int],
    uniform: list[list[int]],
    learn_fraction: float,
    minimum: int,
    workers: int,
    seed: int,
    learned: tuple[NDArray[np.int64], list[LayerCurves]],
) -> list[tuple[float, float]]:
    """(recipe, planned) hit rates per budget on the trace drifted by `scenario`, planned from its own first
    part (the base trace's learning is reused when the shift comes after it: that part is unchanged)."""
    drifted = drift_trace(trace, [scenario], seed)
    learn, score = drifted.split(learn_fraction)
    if round(scenario[0] * trace.steps) < learn.steps:
        learned = learn_from_trace(learn, workers=workers)
    rankings, curves = learned
    planned = [split_from_curves(curves, b, min_slots=minimum) for b in budgets]
    tasks: list[_ScoreTask] = []
    for index in range(len(trace.layers)):
        splits: list[tuple[int, int]] = []
        for i in range(len(budgets)):
            slots = uniform[i][index]
            pinned = round(RECIPE_PINNED_FRACTION * slots)
            splits += [(pinned, slots - pinned), planned[i][index]]
        tasks.append((score.routes[:, index, :], trace.experts, rankings[index], splits, []))
    scored = layer_map(_score_layer, tasks, workers)
    total = score.steps * score.top_k * len(trace.layers)
    return [
        (sum(lru[2 * i] for lru, *_ in scored) / total, sum(lru[2 * i + 1] for lru, *_ in scored) / total)
        for i in range(len(budgets))
    ]


__all__ = [
    "POLICIES",
    "RECIPE_PINNED_FRACTION",
    "BudgetResult",
    "ComparisonReport",
    "DriftResult",
    "PolicyResult",
    "add_engine_policies",
    "compare_policies",
    "parse_budgets",
    "trace_cost_model",
]
