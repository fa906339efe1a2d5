"""The GPU expert cache for ExLlamaV3 (`pkgs/exllamav3/expert-cache`): its sizing, its policy's reference
replay, and the setting chosen from a routing trace.

Per MoE layer the cache holds `pinned` of the layer's hottest experts for good, an LRU window of `window`
experts and `staging` slots for one decode step's misses (top_k per sequence). A step looks its selections up
in order; a hit refreshes its expert, a miss takes the lowest free slot and is copied in from pinned host
memory; afterwards the window keeps its `window` most recent unpinned experts, recency ordered by (step,
position in the step). That is the step model `glm53.plan.cache.hit_curves` scores by stack distance and
`policies.pinned_lru_step_hits` replays, so the planner's simulator is the engine's policy: `replay_lookups`
below is the lookup kernel written out step by step (the tests hold the two equal; on the GPU the kernel's
per-layer counts equal the simulator's, `tools/exl3-expert-cache-bench.py`).

    size_cache(facts, cache_bytes_per_gpu, gpus, pinned_fraction) -> CacheSize
    choose_cache_setting(trace, size)                        -> CacheChoice (recommend's exl3-cache pool)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from glm53.errors import BadInput
from glm53.plan.cache.policies import (
    DEFAULT_HALF_LIFE,
    DEFAULT_RECENT,
    decayed_frequency,
    pinned_lru_step_hits,
)
from glm53.plan.cache.recommend import RECIPE, pinned_share_rates, recommend

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from glm53.plan.inputs.model import ModelFacts
    from glm53.plan.routing.traces import RoutingTrace

# The recipe's policy: the hottest 20% of each layer's slots pinned (EXL3_PINNED_FRAC).
RECIPE_PINNED_FRACTION = 0.2


class CacheSize(BaseModel):
    """One GPU's expert cache, per MoE layer it holds (layers split evenly over the GPUs, as ExLlamaV3's
    layer split does); `slots` are the resident ones (pinned + window), `staging` one step's misses beside."""

    model_config = ConfigDict(frozen=True)

    gpus: int = Field(gt=0)
    layers_per_gpu: int = Field(gt=0, description="MoE layers on the fullest GPU.")
    experts: int = Field(gt=0, description="Routed experts per layer.")
    slot_bytes: int = Field(gt=0, description="One expert's gate, up and down weights.")
    slots: int = Field(ge=0, description="Resident slots per layer: pinned + window.")
    pinned: int = Field(ge=0)
    staging: int = Field(gt=0, description="Slots for one step's misses: top_k x sequences.")
    cache_bytes_per_gpu: int = Field(ge=0, description="What the cache may take of one GPU.")
    host_pool_bytes: int = Field(ge=0, description="Every routed expert once, page-locked: the miss source.")
    arena_bytes_per_gpu: int = Field(
        0,
        ge=0,
        description="EXPERT_CACHE_EXPERTS=host: one layer's experts a GPU, the staging arena that prefill reads "
        "(0: every routed expert is resident, ExLlamaV3's own loader).",
    )

    @property
    def window(self) -> int:
        return self.slots - self.pinned

    @property
    def used_bytes_per_gpu(self) -> int:
        return self.layers_per_gpu * (self.slots + self.staging) * self.slot_bytes

    @property
    def fraction(self) -> float:
        """Resident slots as a share of the layer's experts (the planner's budget)."""
        return self.slots / self.experts

    @property
    def engine_args(self) -> dict[str, int]:
        """What the lookup kernel is given per layer (`glm53_expert_cache.lookup`: pinned, window; the layer's
        slot pool has pinned + window + staging slots)."""
        return {"pinned": self.pinned, "window": self.window, "slots": self.slots + self.staging}


def check_pinned_fraction(value: float, *, flag: str = "--pinned-fraction") -> float:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise BadInput(
            f"{flag} {value:g} is not a share of the slots",
            fix=f"give a value from 0 (plain LRU) to 1 (every slot pinned), e.g. {flag} {RECIPE_PINNED_FRACTION}",
        )
    return value


def arena_bytes(facts: ModelFacts) -> int:
    """EXPERT_CACHE_EXPERTS=host: the staging arena a GPU keeps beside the cache, one MoE layer's routed experts
    (what a prefill pass of that layer reads)."""
    return facts.n_routed_experts * facts.expert_bytes


def size_cache(
    facts: ModelFacts,
    cache_bytes_per_gpu: int,
    *,
    gpus: int,
    pinned_fraction: float = 0.0,
    sequences: int = 1,
    flag: str = "--cache-memory",
) -> CacheSize:
    """The most resident slots per layer that fit `cache_bytes_per_gpu` beside one step's staging, on the GPU
    holding the most MoE layers; at most every expert of the layer."""
    check_pinned_fraction(pinned_fraction)
    if gpus < 1:
        raise BadInput(f"--gpus {gpus} must be at least 1")
    if sequences < 1:
        raise BadInput(f"--max-num-seqs {sequences} must be at least 1")
    layers = len(facts.moe_layers)
    per_gpu = math.ceil(layers / gpus)
    staging = min(facts.n_routed_experts, facts.num_experts_per_tok * sequences)
    slot = facts.expert_bytes
    slots = min(facts.n_routed_experts, cache_bytes_per_gpu // (per_gpu * slot) - staging)
    if slots < 0:
        need = per_gpu * staging * slot
        raise BadInput(
            f"{flag} {cache_bytes_per_gpu / 2**30:.2f} GiB does not fit the cache: {per_gpu} MoE layers a GPU x "
            f"{staging} staging slots x {slot / 2**20:.2f} MiB need {need / 2**30:.2f} GiB before any resident slot",
            fix=f"give {flag} at least {math.ceil(need / 2**30)}GiB, or more --gpus",
        )
    return CacheSize(
        gpus=gpus,
        layers_per_gpu=per_gpu,
        experts=facts.n_routed_experts,
        slot_bytes=slot,
        slots=slots,
        pinned=round(pinned_fraction * slots),
        staging=staging,
        cache_bytes_per_gpu=cache_bytes_per_gpu,
        host_pool_bytes=layers * facts.n_routed_experts * slot,
    )


def check_trace_matches(trace: RoutingTrace, facts: ModelFacts, *, source: str) -> None:
    """A routing capture of another model would plan slots for experts this one does not have."""
    problems = []
    if trace.experts != facts.n_routed_experts:
        problems.append(f"{trace.experts} experts a layer, the model has {facts.n_routed_experts}")
    if trace.top_k != facts.num_experts_per_tok:
        problems.append(f"top-{trace.top_k} routing, the model routes top-{facts.num_experts_per_tok}")
    foreign = sorted(set(trace.layers) - set(facts.moe_layers))
    if foreign:
        problems.append(f"layers {foreign[:5]} that are not MoE layers of the model")
    if problems:
        raise BadInput(
            f"{source} is not a routing capture of {facts.name}: " + "; ".join(problems),
            fix="capture the routing of this model (glm53 serve --capture-routing DIR), or synthesize one "
            "(glm53 plan trace synth)",
        )


def replay_lookups(
    routes: NDArray[np.integer], experts: int, ranking: Sequence[int], pinned: int, window: int
) -> NDArray[np.int16]:
    """One layer's (steps, top_k) selections through the lookup kernel's algorithm, step by step: hits per step.

    Written as the kernel runs (expert_cache.cu, lookup_kernel), not as the stack-distance formula: a hit
    refreshes its stamp (step * top_k + position), a miss is admitted with its stamp, then every unpinned
    resident with `window` or more newer residents is freed.
    """
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    steps, top_k = routes.shape
    if pinned < 0 or window < 0 or pinned > experts:
        raise BadInput(f"pinned {pinned} and window {window} must be non-negative, pinned at most {experts}")
    pinned_set = {int(e) for e in ranking[:pinned]}
    stamp: dict[int, int] = {}  # unpinned resident expert -> stamp
    hits = np.zeros(steps, dtype=np.int16)
    for step in range(steps):
        for position, raw in enumerate(routes[step]):
            expert = int(raw)
            time = step * top_k + position
            if expert in pinned_set:
                hits[step] += 1
            elif expert in stamp:
                hits[step] += 1
                stamp[expert] = time
            else:
                stamp[expert] = time
        if len(stamp) > window:
            ordered = sorted(stamp.values(), reverse=True)
            keep_from = ordered[window - 1] if window else None
            stamp = {e: t for e, t in stamp.items() if keep_from is not None and t >= keep_from}
    return hits


class CacheChoice(BaseModel):
    """The cache's setting chosen on a trace (its policy, and the pinned share or the frequency settings), with
    the held-out hit rates behind it."""

    model_config = ConfigDict(frozen=True)

    policy: Literal["lru", "frequency"] = Field(default="lru", description="EXPERT_CACHE_POLICY.")
    pinned_fraction: float
    recent: int | None = Field(default=None, description="frequency: EXPERT_CACHE_RECENT.")
    half_life: float | None = Field(default=None, description="frequency: EXPERT_CACHE_HALF_LIFE.")
    label: str
    scenarios: list[str]
    hit_rates: list[float] = Field(description="The chosen setting's, per scenario.")
    lru_hit_rates: list[float] = Field(description="Plain LRU's at the same slots, per scenario.")
    recipe_hit_rates: list[float] = Field(description="The recipe's (20% pinned), per scenario.")
    worst_gain_over_lru: float
    learn_steps: int
    layers_replayed: list[int]

    # What the plan claims over the recipe's policy: its worst scenario's margin, as it states its gain over LRU.
    @computed_field  # type: ignore[prop-decorator]
    @property
    def worst_gain_over_recipe(self) -> float:
        return min(hit - recipe for hit, recipe in zip(self.hit_rates, self.recipe_hit_rates, strict=True))


def choose_cache_setting(trace: RoutingTrace, size: CacheSize, *, seed: int = 0) -> CacheChoice:
    """`recommend`'s choice among the cache's policies (`exl3-cache`: the recipe engine's pinned-LRU family and
    decayed frequency at fixed half-lives) at the cache's resident slots: robust first over the stress scenarios,
    plain LRU among the candidates (never more than a quarter point below it on any scenario)."""
    recommendation = recommend(trace, size.fraction, engines=("exl3-cache",), seed=seed)
    choice = recommendation.engine("exl3-cache")
    frequency = choice.choice.family == "decayed-frequency"
    return CacheChoice(
        policy="frequency" if frequency else "lru",
        pinned_fraction=0.0 if frequency else choice.choice.pinned_fraction or 0.0,
        recent=choice.choice.recent if frequency else None,
        half_life=choice.choice.half_life if frequency else None,
        label=choice.label,
        scenarios=[row.scenario for row in choice.scores],
        hit_rates=[row.hit_rate for row in choice.scores],
        lru_hit_rates=[row.lru_hit_rate for row in choice.scores],
        recipe_hit_rates=pinned_share_rates(recommendation, trace, RECIPE.pinned_fraction or 0.0, seed),
        worst_gain_over_lru=choice.worst_gain,
        learn_steps=recommendation.learn_steps,
        layers_replayed=recommendation.layers_replayed,
    )


class ExpertCachePlan(BaseModel):
    """`glm53 plan expert-cache`'s report."""

    model_config = ConfigDict(frozen=True)

    model: str
    size: CacheSize
    choice: CacheChoice | None = None
    source: str | None = None

    # In the report beside the size they come from, derived from it.
    @computed_field  # type: ignore[prop-decorator]
    @property
    def window(self) -> int:
        return self.size.window

    @computed_field  # type: ignore[prop-decorator]
    @property
    def engine_args(self) -> dict[str, int]:
        return self.size.engine_args


# Measured on one H200 with ExLlamaV3 1.4.6's kernels (benchmarks/data/expert-cache-h200.json, docs/serve.md "The
# GPU expert cache"): with the fetch paced to a link, a layer-step took the all-resident time plus misses x expert
# bytes / link rate plus this (lookup, stream fork and join), fitted to 0.4% over the paced runs.
CACHE_OVERHEAD_SECONDS = 0.056e-3
# A PCIe 4.0 x16 link as the recipe's 3090s have it (24.9 GB/s measured with the fetch paced to 25).
ASSUMED_LINK_BYTES_PER_S = 25e9


class CachePrediction(BaseModel):
    """Decode with the cache: the all-resident GPU time, one overhead a MoE layer, and the misses over one link
    (a layer split uses one GPU's link at a time)."""

    model_config = ConfigDict(frozen=True)

    tokens_per_s: float
    hit_rate: float
    hit_rate_source: str
    resident_seconds: float = Field(description="The all-resident model's GPU time a token.")
    miss_seconds: float = Field(description="The misses' bytes over the link, a token.")
    overhead_seconds: float
    link_bytes_per_s: float
    link_source: str


def predict_cache(
    size: CacheSize,
    facts: ModelFacts,
    resident_seconds: float,
    *,
    hit_rate: float | None = None,
    hit_rate_source: str = "",
    link_bytes_per_s: float = ASSUMED_LINK_BYTES_PER_S,
    link_source: str = "assumed: PCIe 4.0 x16, 25 GB/s",
) -> CachePrediction:
    """Seconds a token with `size`'s cache at `hit_rate` (default: uniform routing, slots / experts, the floor a
    cache reaches without any locality)."""
    if hit_rate is None:
        hit_rate = size.fraction
        hit_rate_source = "no routing trace: uniform routing (resident slots / experts), the floor"
    lookups = len(facts.moe_layers) * facts.num_experts_per_tok
    miss = (1 - hit_rate) * lookups * facts.expert_bytes / link_bytes_per_s
    overhead = len(facts.moe_layers) * CACHE_OVERHEAD_SECONDS
    return CachePrediction(
        tokens_per_s=round(1.0 / (resident_seconds + miss + overhead), 2),
        hit_rate=round(hit_rate, 4),
        hit_rate_source=hit_rate_source,
        resident_seconds=resident_seconds,
        miss_seconds=miss,
        overhead_seconds=overhead,
        link_bytes_per_s=link_bytes_per_s,
        link_source=link_source,
    )


class CacheLayerCheck(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    layer: int
    engine_hits: int
    engine_misses: int
    simulated_hits: int
    overflow: int


class CacheCheck(BaseModel):
    """The engine's hit counts (its expert-cache.json) against glm53's simulator replaying the routing the engine
    recorded while it served (`glm53 serve --capture-routing`), layer by layer."""

    model_config = ConfigDict(frozen=True)

    window: int
    pinned: int
    policy: str = Field(default="lru", description="What the window keeps: lru or frequency (EXPERT_CACHE_POLICY).")
    steps: int = Field(description="Decode steps in the capture.")
    top_k: int
    layers: list[CacheLayerCheck]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def equal(self) -> bool:
        """Every layer: the engine's hits are the simulator's, it looked every decode selection up, no overflow."""
        lookups = self.steps * self.top_k
        return bool(self.layers) and all(
            row.engine_hits == row.simulated_hits
            and row.engine_hits + row.engine_misses == lookups
            and not row.overflow
            for row in self.layers
        )


def module_layer(key: str) -> int:
    """The decoder layer of an ExLlamaV3 module key: model.language_model.layers.12.mlp -> 12."""
    try:
        return int(key.split(".layers.")[1].split(".")[0])
    except (IndexError, ValueError) as exc:
        raise BadInput(f"the cache report names {key!r}, not a decoder layer's MoE module") from exc


def check_cache_report(
    report: dict[str, object], trace: RoutingTrace, rankings: dict[str, list[int]] | None = None
) -> CacheCheck:
    """Replay `trace` (the engine's decode steps) through the cache's policy with the report's window and pinned
    slots (pinned experts by `rankings`, the EXPERT_CACHE_STATS counts) and set it beside the engine's counts."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    try:
        window, pinned = int(report["window"]), int(report["pinned"])  # type: ignore[call-overload]
        # reports of the LRU-only cache name no policy
        policy = str(report.get("policy", "lru"))
        recent = int(report.get("recent", DEFAULT_RECENT))  # type: ignore[call-overload]
        half_life = float(report.get("half_life", DEFAULT_HALF_LIFE))  # type: ignore[arg-type]
        if policy not in ("lru", "frequency"):
            raise ValueError(f"unknown policy {policy!r}")
        layers = report["layers"]
        assert isinstance(layers, dict)
        counts = {
            str(key): {name: int(value[name]) for name in ("hits", "misses", "overflow")}
            for key, value in layers.items()
        }
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise BadInput(f"not an expert-cache report: {exc}", fix="give the engine's expert-cache.json") from exc
    if pinned and rankings is None:
        raise BadInput(
            f"the report pins {pinned} experts a layer", fix="give the counts file it ranked them by (--stats)"
        )
    rows = []
    for key, engine in sorted(counts.items(), key=lambda item: module_layer(item[0])):
        layer = module_layer(key)
        if layer not in trace.layers:
            raise BadInput(
                f"the capture has no routing of layer {layer} ({key})", fix="give the capture of the same serve"
            )
        index = trace.layers.index(layer)
        if pinned and rankings is not None and key not in rankings:
            raise BadInput(f"--stats has no counts for {key}, whose pinned experts the report counts")
        ranking = np.array([(rankings or {}).get(key, list(range(trace.experts)))], dtype=np.int64)
        if ranking.shape[1] != trace.experts:
            raise BadInput(f"the counts of {key} rank {ranking.shape[1]} experts, the capture routes {trace.experts}")
        routes = trace.routes[:, index : index + 1, :]
        hits = (
            decayed_frequency(routes, trace.experts, [window], recent=recent, half_life=half_life)
            if policy == "frequency"
            else pinned_lru_step_hits(routes, trace.experts, ranking, [pinned], [window])
        )
        rows.append(
            CacheLayerCheck(
                key=key,
                layer=layer,
                engine_hits=engine["hits"],
                engine_misses=engine["misses"],
                simulated_hits=int(hits.hits.sum()),
                overflow=engine["overflow"],
            )
        )
    return CacheCheck(window=window, pinned=pinned, policy=policy, steps=trace.steps, top_k=trace.top_k, layers=rows)


__all__ = [
    "ASSUMED_LINK_BYTES_PER_S",
    "CACHE_OVERHEAD_SECONDS",
    "RECIPE_PINNED_FRACTION",
    "CacheCheck",
    "CacheChoice",
    "CachePrediction",
    "CacheSize",
    "ExpertCachePlan",
    "arena_bytes",
    "check_cache_report",
    "check_pinned_fraction",
    "check_trace_matches",
    "choose_cache_setting",
    "module_layer",
    "predict_cache",
    "replay_lookups",
    "size_cache",
]
