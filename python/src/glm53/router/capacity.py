"""`glm53 fleet plan`: how many boxes a team of agent users needs for a p95 turn-latency target.

A seeded discrete-event simulation, not a closed formula: the tail of the turn latency is what users feel,
and it comes from the variance of the service times and from sessions pinned to their box. Pure (no I/O
besides the packaged recipe figures) and deterministic for a seed.

The model:
- one box = one glm53 server (2x RTX 3090), `max_num_seqs=1`: one turn at a time, the others wait in FIFO
  order (vLLM's own queue);
- a turn's service time = uncached prompt tokens / prefill rate + answer tokens / decode rate, the rates read
  from the recipe's measured points (decode 48-50 tok/s, prefill 513-1,155 tok/s) at the conversation's
  context, interpolated in log(context) between the measured 8K / 131K / 260K points, clamped outside;
- uncached prompt tokens = prompt tokens x (1 - cache hit); the recipe's agent bench hit 72.9%;
- prompt and answer lengths vary per turn: Gamma-distributed around their means with coefficient of variation
  `cv` (cv=1: exponential; cv=0: fixed);
- every user sends turns as a Poisson process (open loop: a user does not wait for the previous answer);
- `sticky` (the router's consistent_hash on X-Session-ID): all turns of one conversation go to one box, the
  conversations hashed uniformly (seeded) over the boxes; a user starts a new conversation every
  `session_turns` turns; `jsq`: each turn joins the box with the fewest turns waiting or running
  (no session affinity: the cache hit would then be lower than assumed, and the model does not lower it).
"""

from __future__ import annotations

import bisect
import math
import random
from typing import Literal

from pydantic import BaseModel, Field

from glm53.errors import BadInput
from glm53.recipe.performance import recipe_performance

Policy = Literal["sticky", "jsq"]
POLICIES: tuple[Policy, ...] = ("sticky", "jsq")
# The profiles the recipe published figures for (data/recipe-performance.json).
FiguresProfile = Literal["agent-256k", "prefill-256k"]
PROFILES: tuple[FiguresProfile, ...] = ("agent-256k", "prefill-256k")
DEFAULT_CACHE_HIT = 0.729
MAX_CONTEXT = 262_144
MAX_USERS = 100_000
MAX_BOXES = 4096


class RatePoint(BaseModel):
    context: int
    prefill_tok_s: float
    decode_tok_s: float


class PlanInputs(BaseModel):
    """The question `glm53 fleet plan` answers; each field is one of its options."""

    users: int = Field(ge=1, le=MAX_USERS, description="Agent users sending turns.")
    turns_per_min: float = Field(gt=0, description="Turns per user per minute (Poisson).")
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
        description="Share of prompt tokens found in the prefix cache (the default is the recipe's agent bench).",
    )
    cv: float = Field(0.5, ge=0, le=4, description="Variation of prompt and answer lengths (1: exponential).")
    session_turns: int = Field(
        20, ge=1, le=1_000_000, description="Turns per conversation (one X-Session-ID, one box when sticky)."
    )
    policy: Policy = Field("sticky", description="sticky (the router's consistent_hash) or jsq (join-shortest-queue).")
    profile: FiguresProfile = Field("agent-256k", description="The recipe's figures to use: those of this profile.")
    turns: int = Field(20_000, ge=100, le=2_000_000, description="Turns simulated per box count.")
    seed: int = Field(0, description="Seed of the simulation (same seed, same answer).")
    max_boxes: int = Field(512, ge=1, le=MAX_BOXES, description="Largest fleet tried.")


class Candidate(BaseModel):
    boxes: int
    utilization: float = Field(description="offered load / boxes (mean service time x arrival rate / boxes)")
    busiest_box_utilization: float
    p50_s: float
    p95_s: float
    p99_s: float
    max_wait_s: float
    meets: bool


class Plan(BaseModel):
    inputs: PlanInputs
    boxes: int | None = Field(description="fewest boxes meeting the p95 target; None when none does")
    meets: bool
    reason: str | None = None
    arrival_rate_per_s: float
    rates: RatePoint = Field(description="the figures used, at the context")
    mean_service_s: float
    p95_service_s: float = Field(description="the turn alone, no queue: no box count goes below this")
    offered_load_boxes: float = Field(description="arrival rate x mean service time: boxes kept busy on average")
    candidates: list[Candidate]
    assumptions: list[str]


def recipe_points(profile: str) -> list[RatePoint]:
    perf = recipe_performance()
    if profile not in perf.profiles:
        raise BadInput(
            f"--figures {profile!r}: the recipe published no figures for it", hint=f"use one of: {', '.join(PROFILES)}"
        )
    return [
        RatePoint(context=p.context_len, prefill_tok_s=p.prefill_tok_s, decode_tok_s=p.decode_tok_s)
        for p in sorted(perf.profiles[profile], key=lambda p: p.context_len)
    ]


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


def _gamma(rng: random.Random, mean: float, cv: float) -> float:
    if mean <= 0:
        return 0.0
    if cv <= 0:
        return mean
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, mean / shape)


def _workload(inputs: PlanInputs, rates: RatePoint) -> tuple[list[float], list[float], list[float]]:
    """(arrival times, session key of each, service time of each), sorted by time; common to every box count
    (so that box counts are compared on the same turns). A session key is a uniform number in [0, 1): the
    conversation's place on the hash ring. Each user's stream has its own seeded generator, so adding users
    adds turns and changes none of the others'."""
    per_user_rate = inputs.turns_per_min / 60.0
    total_rate = per_user_rate * inputs.users
    horizon = inputs.turns / total_rate
    uncached = inputs.prompt_tokens * (1.0 - inputs.cache_hit)
    events: list[tuple[float, float, float]] = []
    for user in range(inputs.users):
        rng = random.Random(f"{inputs.seed}:user:{user}")
        t = rng.expovariate(per_user_rate)
        count, key = 0, 0.0
        while t < horizon:
            if count % inputs.session_turns == 0:
                key = rng.random()  # a new conversation: a new X-Session-ID, hashed anew
            count += 1
            prefill = _gamma(rng, uncached, inputs.cv) / rates.prefill_tok_s
            decode = _gamma(rng, inputs.answer_tokens, inputs.cv) / rates.decode_tok_s
            events.append((t, key, prefill + decode))
            t += rng.expovariate(per_user_rate)
    events.sort()
    return [e[0] for e in events], [e[1] for e in events], [e[2] for e in events]


def simulate(
    arrivals: list[float], keys: list[float], services: list[float], boxes: int, policy: Policy
) -> tuple[list[float], list[float], list[float]]:
    """FIFO per box, one turn at a time: (latency of each turn, its wait, busy time of each box)."""
    latency: list[float] = []
    waits: list[float] = []
    busy = [0.0] * boxes
    free_at = [0.0] * boxes
    if policy == "sticky":
        for t, key, s in zip(arrivals, keys, services, strict=True):
            box = min(int(key * boxes), boxes - 1)  # the session's box: its key's place among the boxes
            start = max(t, free_at[box])
            free_at[box] = start + s
            busy[box] += s
            waits.append(start - t)
            latency.append(start + s - t)
        return latency, waits, busy
    # Join the shortest queue: the box with the fewest turns waiting or running when the turn arrives.
    departures: list[list[float]] = [[] for _ in range(boxes)]
    heads = [0] * boxes
    for t, s in zip(arrivals, services, strict=True):
        best, best_n = 0, -1
        for box in range(boxes):
            queue = departures[box]
            head = heads[box]
            while head < len(queue) and queue[head] <= t:
                head += 1
            heads[box] = head
            n = len(queue) - head
            if best_n < 0 or n < best_n:
                best, best_n = box, n
                if n == 0:
                    break
        start = max(t, free_at[best])
        free_at[best] = start + s
        departures[best].append(start + s)
        busy[best] += s
        waits.append(start - t)
        latency.append(start + s - t)
    return latency, waits, busy


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def evaluate(inputs: PlanInputs, boxes: int, workload: tuple[list[float], list[float], list[float]]) -> Candidate:
    arrivals, keys, services = workload
    latency, waits, busy = simulate(arrivals, keys, services, boxes, inputs.policy)
    # The first 5% of turns start from empty boxes: left out, as a warm-up.
    skip = len(latency) // 20
    steady = sorted(latency[skip:])
    horizon = arrivals[-1] if arrivals else 1.0
    offered = sum(services) / horizon if horizon > 0 else 0.0
    p95 = _quantile(steady, 0.95)
    return Candidate(
        boxes=boxes,
        utilization=offered / boxes,
        busiest_box_utilization=max(busy) / horizon if horizon > 0 else 0.0,
        p50_s=_quantile(steady, 0.50),
        p95_s=p95,
        p99_s=_quantile(steady, 0.99),
        max_wait_s=max(waits[skip:], default=0.0),
        meets=p95 <= inputs.p95_seconds,
    )


def plan_fleet(inputs: PlanInputs) -> Plan:
    """The fewest boxes whose simulated p95 turn latency meets the target, with the box counts tried."""
    if not math.isfinite(inputs.turns_per_min) or not math.isfinite(inputs.p95_seconds):
        raise BadInput("--turns-per-min and --p95-seconds must be finite numbers")
    points = recipe_points(inputs.profile)
    context = inputs.context if inputs.context is not None else max(inputs.prompt_tokens, 1)
    if context < inputs.prompt_tokens:
        raise BadInput(
            f"--context {context} is smaller than --prompt-tokens {inputs.prompt_tokens}",
            hint="the context is the conversation's length at a turn: at least the prompt",
        )
    if context + inputs.answer_tokens > MAX_CONTEXT:
        raise BadInput(
            f"context {context} + answer {inputs.answer_tokens} tokens exceed the served {MAX_CONTEXT:,}",
            hint="pass a smaller --context / --prompt-tokens / --answer-tokens",
        )
    rates = rates_at(points, context)
    workload = _workload(inputs, rates)
    services = workload[2]
    arrival_rate = inputs.users * inputs.turns_per_min / 60.0
    mean_service = sum(services) / len(services) if services else 0.0
    p95_service = _quantile(sorted(services), 0.95)
    offered = arrival_rate * mean_service
    limit = inputs.max_boxes
    candidates: list[Candidate] = []
    found: int | None = None
    reason: str | None = None
    if p95_service > inputs.p95_seconds:
        reason = (
            f"a turn alone takes {p95_service:.1f} s at p95 (no queue), more than the {inputs.p95_seconds:g} s "
            "target: no number of boxes meets it (shorter prompts or answers, a higher cache hit, or faster boxes do)"
        )
    else:
        boxes = max(1, math.ceil(offered * 1.0001))
        while boxes <= limit:
            candidate = evaluate(inputs, boxes, workload)
            candidates.append(candidate)
            if candidate.meets:
                found = boxes
                break
            # Far from the target, step by the ratio; near it, one box at a time.
            step = 1 if candidate.p95_s < 1.25 * inputs.p95_seconds else max(1, boxes // 4)
            boxes += step
        if found is not None and len(candidates) > 1 and candidates[-2].boxes < found - 1:
            # The last step jumped: walk back down to the fewest boxes that meet the target.
            low = candidates[-2].boxes + 1
            for boxes in range(low, found):
                candidate = evaluate(inputs, boxes, workload)
                candidates.append(candidate)
                if candidate.meets:
                    found = boxes
                    break
        if found is None:
            reason = f"no box count up to {limit} meets the p95 target (--max-boxes)"
        elif found < limit:
            candidates.append(evaluate(inputs, found + 1, workload))  # one more, for the margin
    candidates.sort(key=lambda c: c.boxes)
    return Plan(
        inputs=inputs,
        boxes=found,
        meets=found is not None,
        reason=reason,
        arrival_rate_per_s=arrival_rate,
        rates=rates,
        mean_service_s=mean_service,
        p95_service_s=p95_service,
        offered_load_boxes=offered,
        candidates=candidates,
        assumptions=assumptions(inputs, rates, context),
    )


def assumptions(inputs: PlanInputs, rates: RatePoint, context: int) -> list[str]:
    policy = (
        "sticky sessions (the router's consistent_hash on X-Session-ID): all turns of a conversation "
        f"({inputs.session_turns} turns, then the user starts a new one) go to one box, conversations hashed "
        "uniformly over the boxes, so boxes are unevenly loaded, as a hash ring makes them"
        if inputs.policy == "sticky"
        else "join-shortest-queue: each turn goes to the box with the fewest turns waiting or running (no "
        "session affinity: a real cache hit would then be lower than the one assumed)"
    )
    return [
        "one box = one glm53 server on 2x RTX 3090, max_num_seqs=1: one turn at a time, the rest wait FIFO",
        f"rates from the recipe's measured {inputs.profile} points at a {context:,}-token context: prefill "
        f"{rates.prefill_tok_s:,.0f} tok/s, decode {rates.decode_tok_s:.1f} tok/s (log-context interpolation "
        "between 8K/131K/260K, clamped outside)",
        f"service time = prompt x (1 - {inputs.cache_hit:.1%} cache hit) / prefill + answer / decode; prompt and "
        f"answer lengths Gamma-distributed around {inputs.prompt_tokens:,} and {inputs.answer_tokens:,} tokens, "
        f"cv {inputs.cv:g}",
        f"each of {inputs.users} users sends turns as a Poisson process at {inputs.turns_per_min:g}/min (open loop)",
        policy,
        f"turn latency = wait + prefill + decode (arrival to last token); {inputs.turns:,} turns simulated per box "
        f"count, first 5% left out as warm-up, seed {inputs.seed}",
        "not modelled: router overhead, network, KV-cache evictions under load, a box failing (add one spare box)",
    ]


__all__ = [
    "POLICIES",
    "Candidate",
    "Plan",
    "PlanInputs",
    "RatePoint",
    "evaluate",
    "plan_fleet",
    "rates_at",
    "recipe_points",
    "simulate",
]
