"""`glm53 fleet plan`: how many boxes a team of agent users needs for a p95 turn-latency target.

Seeded simulations (glm53.router.simulation) of agent users in closed loop (send, wait for the answer,
think), vllm-router 0.1.17's policies as it implements them, and one-at-a-time boxes, at the recipe's
measured agent figures. The tail of the turn latency is what users feel; it comes from the variance of the
turns, from how the router spreads sessions, and from the prefix cache each policy keeps or loses, so no
closed formula gives it.

One seed is one possible team (its turns, its session ids, hence where the router puts them): the answer is
the fewest boxes whose p95 meets the target for every seed tried, with the spread of the per-seed answers
beside it. Pure (no I/O besides the packaged recipe figures) and deterministic for a seed range.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from glm53.errors import BadInput
from glm53.recipe.performance import recipe_performance
from glm53.router.simulation import (
    ROUTER_POLICIES,
    Outcome,
    RouterPolicy,
    Service,
    TrafficModel,
    Workload,
    default_urls,
    quantile,
    simulate,
    turn_book,
)

# The profiles the recipe published figures for (data/recipe-performance.json).
FiguresProfile = Literal["agent-256k", "prefill-256k"]
PROFILES: tuple[FiguresProfile, ...] = ("agent-256k", "prefill-256k")
POLICIES: tuple[str, ...] = ROUTER_POLICIES
# The policy `glm53 router` runs by default: the one the model recommends for agent users (docs/scale-out.md).
RECOMMENDED_POLICY: RouterPolicy = "sticky_least_loaded"
DEFAULT_CACHE_HIT = 0.729  # the recipe's agent bench: prompt tokens found in cache
MAX_CONTEXT = 262_144
# The agent profile's KV cache is sized for one full context: this many tokens of conversations stay cached.
KV_CACHE_TOKENS = MAX_CONTEXT
MAX_USERS = 100_000
MAX_BOXES = 4096


class RatePoint(BaseModel):
    context: int
    prefill_tok_s: float
    decode_tok_s: float


class PlanInputs(BaseModel):
    """The question `glm53 fleet plan` answers; each field is one of its options."""

    users: int = Field(ge=1, le=MAX_USERS, description="Agent users, one conversation each at a time.")
    turns_per_min: float = Field(
        gt=0,
        le=600,
        description="The pace a user keeps when answers are fast (turns a minute): closed loop, the think time "
        "after an answer averages 60/this s less a turn's unloaded time; open loop, the rate turns are sent at.",
    )
    min_pace: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Target: users get at least this share of --turns-per-min on every seed, queueing included.",
    )
    prompt_tokens: int = Field(
        16_384, ge=0, le=MAX_CONTEXT, description="Prompt tokens per turn, on average (the conversation resent)."
    )
    answer_tokens: int = Field(300, ge=1, le=MAX_CONTEXT, description="Generated tokens per turn, on average.")
    p95_seconds: float = Field(60.0, gt=0, description="Target: 95% of turns done within this, queueing included.")
    context: int | None = Field(
        None, ge=1, le=MAX_CONTEXT, description="Context for the rates (default: the prompt tokens)."
    )
    cache_hit: float = Field(
        DEFAULT_CACHE_HIT,
        ge=0,
        le=1,
        description="Share of a prompt found in cache on the box holding its conversation (the default is the "
        "recipe's agent bench).",
    )
    cv: float = Field(0.5, ge=0, le=4, description="Variation of prompt and answer lengths (1: exponential).")
    session_turns: int = Field(
        20, ge=1, le=1_000_000, description="Turns per conversation (one X-Session-ID), then a new one."
    )
    policy: RouterPolicy = Field(RECOMMENDED_POLICY, description="The router's policy, as vllm-router 0.1.17 routes.")
    finish_sessions: bool = Field(
        True,
        description="Clients close each conversation with POST /finish_session (glm53 bench agent does); "
        "sticky_least_loaded then counts only open ones.",
    )
    compare: bool = Field(False, description="Plan every router policy and recommend one.")
    traffic: TrafficModel = Field(
        "closed",
        description="closed: send, wait for the answer, think; open: Poisson turns that do not wait (to compare).",
    )
    decode_tok_s: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description="Decode rate in agent turns (default: the recipe's 37.7 tok/s on real agent turns, lower at "
        "longer contexts).",
    )
    cached_conversations: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Conversations a box's prefix cache holds (default: 262,144 tokens / context).",
    )
    profile: FiguresProfile = Field("agent-256k", description="The recipe's figures to use: those of this profile.")
    turns: int = Field(4000, ge=100, le=2_000_000, description="Turns simulated per seed and box count.")
    seeds: int = Field(10, ge=1, le=1000, description="Seeds simulated, from --seed on: the answer holds for each.")
    seed: int = Field(0, ge=0, description="The first seed (same seeds, same answer).")
    max_boxes: int = Field(512, ge=1, le=MAX_BOXES, description="Largest fleet tried.")

    @property
    def pace_target(self) -> float:
        """The least pace accepted, turns a minute: --min-pace x --turns-per-min."""
        return self.min_pace * self.turns_per_min


class Spread(BaseModel):
    """A figure over the seeds: median and range."""

    median: float
    low: float
    high: float


def spread(values: list[float]) -> Spread:
    return Spread(median=statistics.median(values), low=min(values), high=max(values))


class FleetCandidate(BaseModel):
    boxes: int
    p50_s: Spread
    p95_s: Spread
    p99_s: Spread
    pace_turns_per_min: Spread = Field(description="turns each user got through per minute")
    cache_hit: Spread = Field(description="share of prompt tokens found in cache")
    utilization: Spread
    busiest_box_utilization: Spread
    max_wait_s: Spread
    seeds_meeting: int = Field(description="seeds meeting both targets")
    p95_meets: bool = Field(description="every seed's p95 meets the latency target")
    pace_meets: bool = Field(description="every seed's pace meets the pace target")
    meets: bool = Field(description="both, for every seed")


class PolicyPlan(BaseModel):
    policy: RouterPolicy
    finish_sessions: bool
    label: str
    boxes: int | None = Field(description="fewest boxes whose p95 meets the target for every seed; None: none")
    boxes_by_seed: list[int | None] = Field(
        description="each seed's own fewest boxes, seeds in order, up to the first with none"
    )
    boxes_spread: Spread | None = Field(description="median and range of the per-seed answers")
    candidates: list[FleetCandidate] = Field(description="box counts simulated for every seed")
    p95_only_boxes: int | None = Field(None, description="the answer were the p95 target the only one")
    decided_by: Literal["p95", "pace"] | None = Field(
        None, description="the target that set the answer: pace where the p95 alone would need fewer boxes"
    )
    reason: str | None = None

    @property
    def chosen(self) -> FleetCandidate | None:
        return next((c for c in self.candidates if c.boxes == self.boxes), None)


class FleetPlan(BaseModel):
    inputs: PlanInputs
    boxes: int | None = Field(description="the answer: the planned (or recommended) policy's box count")
    meets: bool
    policy: str = Field(description="the policy the answer is for")
    recommended: str | None = Field(None, description="with --compare: the policy needing the fewest boxes")
    reason: str | None = None
    think_s: float
    pace_target_turns_per_min: float = Field(description="--min-pace x --turns-per-min: the least pace accepted")
    pace_note: str | None = Field(None, description="set when the pace asked is beyond even an idle fleet")
    rates: RatePoint = Field(description="the figures used, at the context")
    cached_conversations: int
    mean_service_s: float = Field(description="a turn alone on a box holding its conversation")
    p95_service_s: float = Field(description="the turn alone, no queue: no box count goes below this")
    offered_load_boxes: float = Field(description="boxes kept busy if no turn ever waited")
    policies: list[PolicyPlan]
    assumptions: list[str]


def recipe_points(profile: str) -> list[RatePoint]:
    perf = recipe_performance()
    if profile not in perf.profiles:
        raise BadInput(
            f"--figures {profile!r}: the recipe published no figures for it", fix=f"use one of: {', '.join(PROFILES)}"
        )
    return [
        RatePoint(context=p.context_len, prefill_tok_s=p.prefill_tok_s, decode_tok_s=p.decode_tok_s)
        for p in sorted(perf.profiles[profile], key=lambda p: p.context_len)
    ]


def agent_decode_share() -> float:
    """The recipe's decode on real agent turns over its agent profile's best decode (37.7 / 50.4)."""
    perf = recipe_performance()
    best = min(perf.profiles[perf.agent.profile], key=lambda p: p.context_len).decode_tok_s
    return perf.agent.mean_decode_tok_s / best


def rates_at(points: list[RatePoint], context: int) -> RatePoint:
    """The rates at `context`: linear in log(context) between the measured points, clamped outside them."""
    if context <= points[0].context:
        return points[0].model_copy(update={"context": context})
    if context >= points[-1].context:
        return points[-1].model_copy(update={"context": context})
    i = bisect.bisect_right([p.context for p in points], context)
    lo, hi = points[i - 1], points[i]
    t = (math.log(context) - math.log(lo.context)) / (math.log(hi.context) - math.log(lo.context))
    return RatePoint(
        context=context,
        prefill_tok_s=lo.prefill_tok_s + t * (hi.prefill_tok_s - lo.prefill_tok_s),
        decode_tok_s=lo.decode_tok_s + t * (hi.decode_tok_s - lo.decode_tok_s),
    )


def agent_rates(inputs: PlanInputs, context: int) -> RatePoint:
    """Prefill at the context from the profile's points; decode as on the recipe's real agent turns."""
    measured = rates_at(recipe_points(inputs.profile), context)
    decode = inputs.decode_tok_s if inputs.decode_tok_s is not None else measured.decode_tok_s * agent_decode_share()
    return measured.model_copy(update={"decode_tok_s": decode})


def variant_label(policy: str, finish_sessions: bool) -> str:
    if policy == "sticky_least_loaded" and not finish_sessions:
        return "sticky_least_loaded (no /finish_session)"
    return policy


# Every policy with --compare; sticky_least_loaded twice: its sessions close through /finish_session, or idle out.
VARIANTS: tuple[tuple[RouterPolicy, bool], ...] = (
    ("sticky_least_loaded", True),
    ("sticky_least_loaded", False),
    ("consistent_hash", True),
    ("cache_aware", True),
    ("power_of_two", True),
    ("round_robin", True),
    ("random", True),
)


class _Evaluator:
    """Simulations of one policy, memoized by (boxes, seed)."""

    def __init__(
        self, inputs: PlanInputs, service: Service, policy: RouterPolicy, finish: bool, think_s: float
    ) -> None:
        self.inputs, self.service, self.policy, self.finish = inputs, service, policy, finish
        self.think_s = think_s
        self.memo: dict[tuple[int, int], RunSummary] = {}

    def workload(self, seed: int) -> Workload:
        i = self.inputs
        return Workload(
            users=i.users,
            think_s=self.think_s,
            prompt_tokens=i.prompt_tokens,
            answer_tokens=i.answer_tokens,
            cv=i.cv,
            session_turns=i.session_turns,
            seed=seed,
            traffic=i.traffic,
        )

    def outcome(self, boxes: int, seed: int) -> RunSummary:
        key = (boxes, seed)
        if key not in self.memo:
            run = simulate(
                self.workload(seed),
                self.service,
                self.policy,
                default_urls(boxes),
                finish_sessions=self.finish,
                total_turns=self.inputs.turns,
            )
            # Only the figures are kept: a plan simulates hundreds of runs of thousands of turns.
            self.memo[key] = RunSummary.of(run)
        return self.memo[key]

    def p95_meets(self, boxes: int, seed: int) -> bool:
        return self.outcome(boxes, seed).p95 <= self.inputs.p95_seconds

    def pace_meets(self, boxes: int, seed: int) -> bool:
        return self.outcome(boxes, seed).pace_turns_per_min >= self.inputs.pace_target

    def meets(self, boxes: int, seed: int) -> bool:
        return self.p95_meets(boxes, seed) and self.pace_meets(boxes, seed)


@dataclass(frozen=True)
class RunSummary:
    """What a plan reads of one simulated run."""

    p50: float
    p95: float
    p99: float
    pace_turns_per_min: float
    cache_hit: float
    utilization: float
    busiest_box_utilization: float
    max_wait_s: float

    @classmethod
    def of(cls, run: Outcome) -> RunSummary:
        latencies = run.latencies()
        return cls(
            p50=quantile(latencies, 0.50),
            p95=quantile(latencies, 0.95),
            p99=quantile(latencies, 0.99),
            pace_turns_per_min=run.pace_turns_per_min,
            cache_hit=run.cache_hit,
            utilization=run.utilization,
            busiest_box_utilization=run.busiest_box_utilization,
            max_wait_s=run.max_wait_s,
        )


def _fewest(meets: Callable[[int], bool], guess: int, limit: int) -> int | None:
    """The fewest boxes in [1, limit] that meet, searching out from `guess` (the p95 falls as boxes are added,
    give or take a seed's luck: a local answer)."""
    guess = min(max(1, guess), limit)
    if meets(guess):
        hi, step = guess, 1
        while hi - step >= 1 and meets(hi - step):
            hi -= step
            step *= 2
        lo = max(0, hi - step)
    else:
        lo, step = guess, 1
        while lo + step < limit and not meets(lo + step):
            lo += step
            step *= 2
        hi = min(lo + step, limit)
        if hi == limit and not meets(limit):
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _meets(evaluator: _Evaluator, boxes: int, *, seed: int) -> bool:
    return evaluator.meets(boxes, seed)


def _p95_meets(evaluator: _Evaluator, boxes: int, *, seed: int) -> bool:
    return evaluator.p95_meets(boxes, seed)


def _candidate(evaluator: _Evaluator, boxes: int, seeds: list[int]) -> FleetCandidate:
    runs = [evaluator.outcome(boxes, seed) for seed in seeds]
    p95_ok = [evaluator.p95_meets(boxes, seed) for seed in seeds]
    pace_ok = [evaluator.pace_meets(boxes, seed) for seed in seeds]
    return FleetCandidate(
        boxes=boxes,
        p50_s=spread([run.p50 for run in runs]),
        p95_s=spread([run.p95 for run in runs]),
        p99_s=spread([run.p99 for run in runs]),
        pace_turns_per_min=spread([run.pace_turns_per_min for run in runs]),
        cache_hit=spread([run.cache_hit for run in runs]),
        utilization=spread([run.utilization for run in runs]),
        busiest_box_utilization=spread([run.busiest_box_utilization for run in runs]),
        max_wait_s=spread([run.max_wait_s for run in runs]),
        seeds_meeting=sum(1 for a, b in zip(p95_ok, pace_ok, strict=True) if a and b),
        p95_meets=all(p95_ok),
        pace_meets=all(pace_ok),
        meets=all(p95_ok) and all(pace_ok),
    )


def _fewest_for_every_seed(
    meets: Callable[..., bool], seeds: list[int], guess: int, limit: int
) -> tuple[int | None, list[int | None]]:
    """The fewest boxes meeting for every seed (None: none up to `limit`), and each seed's own answer;
    `meets(boxes, seed=seed)`. The seeds stop at the first with no answer: none for every seed then."""
    by_seed: list[int | None] = []
    start = guess
    for seed in seeds:
        found = _fewest(functools.partial(meets, seed=seed), start, limit)
        by_seed.append(found)
        if found is None:
            return None, by_seed
        start = found
    boxes = max(b for b in by_seed if b is not None)
    # A seed's own answer is local: every seed must meet at the box count given.
    while boxes <= limit and not all(meets(boxes, seed=seed) for seed in seeds):
        boxes += 1
    return (boxes if boxes <= limit else None), by_seed


def plan_policy(
    inputs: PlanInputs, service: Service, policy: RouterPolicy, finish: bool, guess: int, think_s: float
) -> PolicyPlan:
    evaluator = _Evaluator(inputs, service, policy, finish, think_s)
    seeds = list(range(inputs.seed, inputs.seed + inputs.seeds))
    limit = inputs.max_boxes
    label = variant_label(policy, finish)
    boxes, by_seed = _fewest_for_every_seed(functools.partial(_meets, evaluator), seeds, guess, limit)
    p95_only, _ = _fewest_for_every_seed(functools.partial(_p95_meets, evaluator), seeds, guess, limit)
    answers = [b for b in by_seed if b is not None]
    reason: str | None = None
    decided_by: Literal["p95", "pace"] | None = None
    if boxes is None:
        missed = "the p95 target" if p95_only is None else f"the pace target ({inputs.pace_target:.2f} turns/min)"
        reason = (
            f"{label}: no box count up to {limit} meets {missed} for every seed: this traffic needs more boxes "
            "than --max-boxes allows (raise it), or fewer users, a slower pace or a looser target"
        )
    else:
        decided_by = "pace" if p95_only is None or boxes > p95_only else "p95"
    shown = sorted({n for n in (boxes, (boxes or 0) - 1) if n is not None and n >= 1})
    return PolicyPlan(
        policy=policy,
        finish_sessions=finish,
        label=label,
        boxes=boxes,
        boxes_by_seed=by_seed,
        boxes_spread=spread([float(b) for b in answers]) if answers and not reason else None,
        candidates=[_candidate(evaluator, n, seeds) for n in shown],
        p95_only_boxes=p95_only,
        decided_by=decided_by,
        reason=reason,
    )


def recommend(policies: list[PolicyPlan]) -> PolicyPlan | None:
    """The policy needing the fewest boxes; on a tie, the one keeping more of the prefix cache (its boxes
    have room to spare for longer prompts), then the lower p95. Clients that close their sessions are what
    glm53 runs (bench agent does): the variant without /finish_session is shown, not recommended."""

    def key(p: PolicyPlan) -> tuple[int, float, float]:
        c = p.chosen
        return (p.boxes or 0, -round(c.cache_hit.median if c else 0.0, 3), c.p95_s.median if c else 0.0)

    meeting = [p for p in policies if p.boxes is not None and p.finish_sessions]
    return min(meeting, key=key) if meeting else None


def _check(inputs: PlanInputs) -> int:
    if not math.isfinite(inputs.turns_per_min) or not math.isfinite(inputs.p95_seconds):
        raise BadInput("--turns-per-min and --p95-seconds must be finite numbers")
    context = inputs.context if inputs.context is not None else max(inputs.prompt_tokens, 1)
    if context < inputs.prompt_tokens:
        raise BadInput(
            f"--context {context} is smaller than --prompt-tokens {inputs.prompt_tokens}",
            fix="the context is the conversation's length at a turn: at least the prompt",
        )
    if context + inputs.answer_tokens > MAX_CONTEXT:
        raise BadInput(
            f"context {context} + answer {inputs.answer_tokens} tokens exceed the served {MAX_CONTEXT:,}",
            fix="pass a smaller --context / --prompt-tokens / --answer-tokens",
        )
    return context


def plan_fleet(inputs: PlanInputs) -> FleetPlan:
    """The fewest boxes whose simulated p95 turn latency meets the target for every seed, per policy."""
    context = _check(inputs)
    rates = agent_rates(inputs, context)
    cached = inputs.cached_conversations or max(1, KV_CACHE_TOKENS // context)
    service = Service(
        prefill_tok_s=rates.prefill_tok_s,
        decode_tok_s=rates.decode_tok_s,
        cache_hit=inputs.cache_hit,
        cached_conversations=cached,
    )
    alone = _turns_alone(inputs, service)
    mean_service = statistics.fmean(alone)
    p95_service = quantile(alone, 0.95)
    interval = 60.0 / inputs.turns_per_min
    # Closed loop: the pace asked is kept when answers are fast, so the think time is what is left of a
    # user's interval between turns after an unloaded turn; open loop, the interval is the Poisson mean.
    think = max(0.0, interval - mean_service) if inputs.traffic == "closed" else interval
    busy_share = mean_service / (mean_service + think) if inputs.traffic == "closed" else mean_service / think
    offered = inputs.users * busy_share
    variants = VARIANTS if inputs.compare else ((inputs.policy, inputs.finish_sessions),)
    policies: list[PolicyPlan] = []
    reason: str | None = None
    idle_pace = 60.0 / mean_service
    pace_note = None
    if inputs.traffic == "closed" and interval < mean_service:
        pace_note = (
            f"{inputs.turns_per_min:g} turns/min is a turn every {interval:.1f} s, but a turn alone takes "
            f"{mean_service:.1f} s on average: even an idle fleet gives a user at most {idle_pace:.2f} turns/min"
        )
    if pace_note is not None and interval < inputs.min_pace * mean_service:
        reason = (
            f"{pace_note}, below the {inputs.min_pace:.0%} of {inputs.turns_per_min:g} asked (--min-pace); ask for "
            f"at most {idle_pace / inputs.min_pace:.2f} turns/min, or shorter turns"
        )
    elif p95_service > inputs.p95_seconds:
        reason = (
            f"a turn alone takes {p95_service:.1f} s at p95 (no queue), more than the {inputs.p95_seconds:g} s "
            "target: no number of boxes meets it (shorter prompts or answers, a higher cache hit, or faster boxes do)"
        )
    else:
        guess = max(1, math.ceil(offered))
        for policy, finish in variants:
            policies.append(plan_policy(inputs, service, policy, finish, guess, think))
    chosen = policies[0] if policies else None
    recommended = None
    if inputs.compare and (best := recommend(policies)) is not None:
        chosen, recommended = best, best.label
    if reason is None and chosen is not None and chosen.boxes is None:
        reason = chosen.reason
    return FleetPlan(
        inputs=inputs,
        boxes=chosen.boxes if chosen is not None else None,
        meets=chosen is not None and chosen.boxes is not None,
        policy=chosen.label if chosen is not None else variant_label(inputs.policy, inputs.finish_sessions),
        recommended=recommended,
        reason=reason,
        think_s=think,
        pace_target_turns_per_min=inputs.pace_target,
        pace_note=pace_note,
        rates=rates,
        cached_conversations=cached,
        mean_service_s=mean_service,
        p95_service_s=p95_service,
        offered_load_boxes=offered,
        policies=policies,
        assumptions=assumptions(inputs, rates, context, cached, think),
    )


def _turns_alone(inputs: PlanInputs, service: Service) -> list[float]:
    """Service times of the first seed's turns on a box holding their conversation, sorted (the think time
    draws nothing of the turns' lengths: any value books the same turns)."""
    workload = Workload(
        users=inputs.users,
        think_s=60.0 / inputs.turns_per_min,
        prompt_tokens=inputs.prompt_tokens,
        answer_tokens=inputs.answer_tokens,
        cv=inputs.cv,
        session_turns=inputs.session_turns,
        seed=inputs.seed,
        traffic=inputs.traffic,
    )
    book = turn_book(workload)
    per_user = max(1, math.ceil(inputs.turns / inputs.users))
    warm = 1.0 - service.cache_hit
    return sorted(
        t.prompt_tokens * warm / service.prefill_tok_s + t.answer_tokens / service.decode_tok_s
        for u in range(inputs.users)
        for t in (book.turn(u, k) for k in range(per_user))
    )


def assumptions(inputs: PlanInputs, rates: RatePoint, context: int, cached: int, think: float) -> list[str]:
    traffic = (
        f"closed loop: each of {inputs.users} users sends a turn, waits for the whole answer, then thinks "
        f"{think:.1f} s on average (exponential) before the next: {inputs.turns_per_min:g} turns/min when answers "
        f"take their unloaded time; the answer keeps the pace users get >= {inputs.min_pace:.0%} of that "
        "(--min-pace) as well as the p95"
        if inputs.traffic == "closed"
        else f"open loop (--traffic open): each of {inputs.users} users sends turns as a Poisson process at "
        f"{inputs.turns_per_min:g}/min without waiting for answers: a conversation's turns can queue behind each other"
    )
    decode_from = (
        "as given (--decode-tok-s)"
        if inputs.decode_tok_s is not None
        else f"the recipe's real agent turns ({agent_decode_share():.0%} of its best decode), at this context"
    )
    return [
        "one box = one glm53 server on 2x RTX 3090, max_num_seqs=1: one turn at a time, the rest wait FIFO",
        f"rates at a {context:,}-token context: prefill {rates.prefill_tok_s:,.0f} tok/s (the recipe's measured "
        f"{inputs.profile} points, log-context interpolation), decode {rates.decode_tok_s:.1f} tok/s, {decode_from}",
        f"a turn = uncached prompt / prefill + answer / decode; on the box holding its conversation (or opening "
        f"one) {inputs.cache_hit:.1%} of its prompt is cached, elsewhere none; a box's prefix cache keeps its "
        f"last {cached} conversations (LRU); prompt and answer lengths Gamma-distributed around "
        f"{inputs.prompt_tokens:,} and {inputs.answer_tokens:,} tokens, cv {inputs.cv:g}",
        traffic,
        f"a conversation is {inputs.session_turns} turns under one X-Session-ID, then the user starts a new one"
        + (" and closes the old one with POST /finish_session" if inputs.finish_sessions else ""),
        "vllm-router 0.1.17's policies as its source and binary route: consistent_hash's ring of 160 virtual "
        "nodes per box, sticky_least_loaded's open-session counts, power_of_two's in-flight counts, "
        "cache_aware's thresholds (without token ids for this model its prefix tree never matches: the least "
        "loaded box), round_robin, random",
        f"turn latency = wait + prefill + decode (sent to last token); {inputs.turns:,} turns per simulation, the "
        f"first 5% left out as warm-up; seeds {inputs.seed}-{inputs.seed + inputs.seeds - 1}, the answer meets "
        "the target for every one",
        "not modelled: router overhead, network, a box failing (add one spare box)",
    ]


__all__ = [
    "DEFAULT_CACHE_HIT",
    "MAX_CONTEXT",
    "POLICIES",
    "PROFILES",
    "RECOMMENDED_POLICY",
    "VARIANTS",
    "FiguresProfile",
    "FleetCandidate",
    "FleetPlan",
    "PlanInputs",
    "PolicyPlan",
    "RatePoint",
    "Spread",
    "agent_rates",
    "plan_fleet",
    "plan_policy",
    "rates_at",
    "recipe_points",
    "recommend",
]
