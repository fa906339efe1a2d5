"""Agent users, vllm-router 0.1.17 and one-at-a-time glm53 boxes, as a seeded discrete-event simulation.

Users (`closed`, the default traffic model): each user sends a turn, waits for the whole answer, thinks, and
sends the next one, which carries the answer: a conversation never has two turns in flight. A user's
conversation lasts `session_turns` turns under one X-Session-ID, then the user starts a new one. `open` is the
other traffic model, kept for comparison: each user sends on a Poisson clock whether or not the last answer
has come.

The router, each policy as vllm-router 0.1.17 implements it (its Rust sources, src/policies/*.rs, and the
installed binary's behaviour, tests/test_fleet_router.py):
- consistent_hash: the session's point on a ring of 160 virtual nodes per box (glm53.router.hashing);
- sticky_least_loaded: a session stays on its box; a new session goes to the box with the fewest open
  sessions (rendezvous hash on a tie). A session is open until the client POSTs /finish_session, or until
  it has been idle for 2 hours (VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S; swept at most once a minute);
- power_of_two: two distinct boxes at random, the one with fewer requests in flight through the router (the
  first on a tie; its /get_load poll finds nothing on vLLM, so in-flight counts are all it has);
- cache_aware: when the in-flight counts are imbalanced (max - min > 64 and max > 1.5 min) the least loaded
  box; otherwise the box whose prefix tree matches more than 30% of the prompt, else the least loaded. The
  tree is built from token ids, which the router cannot compute for a glm53 fleet (it has no tokenizer for
  the served model: it logs `invalid_token_ids`), so every request goes to the first box with the fewest
  requests in flight: no session affinity;
- round_robin: the next box in turn; random: any box.

A box runs one turn at a time (max_num_seqs=1), the others wait in its FIFO queue (vLLM's own). A turn takes
uncached prompt tokens / prefill rate + answer tokens / decode rate. The box's prefix cache holds the
last `cached_conversations` conversations it served (LRU): a turn whose conversation is among them (or that
opens a conversation: its prefix is the shared system prompt and tools) finds `cache_hit` of its prompt
cached; any other turn is prefilled in full.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import statistics
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from glm53.router.hashing import HashRing, rendezvous_pick

TrafficModel = Literal["closed", "open"]
RouterPolicy = Literal["sticky_least_loaded", "consistent_hash", "power_of_two", "cache_aware", "round_robin", "random"]
ROUTER_POLICIES: tuple[RouterPolicy, ...] = RouterPolicy.__args__  # type: ignore[attr-defined]
# Policies that keep every turn of a session on one box.
STICKY_POLICIES = frozenset({"sticky_least_loaded", "consistent_hash"})

# vllm-router 0.1.17's constants (src/policies/sticky_least_loaded.rs, cache_aware.rs defaults).
SLL_SESSION_EXPIRATION_S = 7200.0
SLL_SWEEP_INTERVAL_S = 60.0
CACHE_AWARE_BALANCE_ABS = 64
CACHE_AWARE_BALANCE_REL = 1.5


@dataclass(frozen=True)
class Workload:
    """What the users do; the same turns whatever the fleet (each user's stream is seeded by itself)."""

    users: int
    think_s: float  # mean time between an answer and the next turn (closed); mean gap between turns (open)
    prompt_tokens: float
    answer_tokens: float
    cv: float
    session_turns: int
    seed: int
    traffic: TrafficModel = "closed"


@dataclass(frozen=True)
class Service:
    prefill_tok_s: float
    decode_tok_s: float
    cache_hit: float
    cached_conversations: int


@dataclass(frozen=True)
class Turn:
    user: int
    index: int  # the user's turn number, from 0
    think_s: float  # before this turn
    prompt_tokens: float
    answer_tokens: float
    session: str
    opens: bool  # the conversation's first turn
    closes: bool  # the conversation's last turn


def _gamma(rng: random.Random, mean: float, cv: float) -> float:
    if mean <= 0:
        return 0.0
    if cv <= 0:
        return mean
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, mean / shape)


class TurnBook:
    """Every user's turns, drawn from the user's own generator in order and kept: each box count and policy
    tried for one workload replays the same turns, and draws them once."""

    def __init__(self, workload: Workload) -> None:
        self._w = workload
        self._rngs = [random.Random(f"{workload.seed}:user:{u}") for u in range(workload.users)]
        self._turns: list[list[Turn]] = [[] for _ in range(workload.users)]

    def turn(self, user: int, index: int) -> Turn:
        turns = self._turns[user]
        while len(turns) <= index:
            turns.append(self._draw(user, len(turns)))
        return turns[index]

    def _draw(self, user: int, k: int) -> Turn:
        w, rng = self._w, self._rngs[user]
        think = rng.expovariate(1.0 / w.think_s) if w.think_s > 0 else 0.0
        prompt = _gamma(rng, w.prompt_tokens, w.cv)
        answer = max(1.0, _gamma(rng, w.answer_tokens, w.cv))
        position = k % w.session_turns
        return Turn(
            user=user,
            index=k,
            think_s=think,
            prompt_tokens=prompt,
            answer_tokens=answer,
            session=f"glm53-s{w.seed}-u{user}-c{k // w.session_turns}",
            opens=position == 0,
            closes=position == w.session_turns - 1,
        )


@functools.lru_cache(maxsize=16)
def turn_book(workload: Workload) -> TurnBook:
    return TurnBook(workload)


def user_turns(workload: Workload, user: int, count: int) -> list[Turn]:
    book = turn_book(workload)
    return [book.turn(user, k) for k in range(count)]


def default_urls(boxes: int) -> list[str]:
    """Stand-in backend URLs for planning: where a session hashes depends on them, as on a real fleet."""
    return [f"http://10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(boxes)]


class Router:
    """vllm-router's choice of box for one request, and the state it keeps."""

    def __init__(self, policy: RouterPolicy, urls: Sequence[str], seed: int) -> None:
        self.policy = policy
        self.urls = list(urls)
        self.n = len(self.urls)
        self.in_flight = [0] * self.n
        self.rng = random.Random(f"{seed}:router")
        self._ring = HashRing(self.urls) if policy == "consistent_hash" else None
        self._ring_memo: dict[str, int] = {}
        self._next = 0
        # sticky_least_loaded: session -> (box, last access); open sessions per box.
        self.sessions: dict[str, list[float]] = {}
        self.open_sessions = [0] * self.n
        self._last_sweep = 0.0

    def route(self, session: str, now: float) -> int:
        box = self._choose(session, now)
        self.in_flight[box] += 1
        return box

    def done(self, box: int) -> None:
        self.in_flight[box] -= 1

    def finish_session(self, session: str) -> None:
        entry = self.sessions.pop(session, None)
        if entry is not None:
            self.open_sessions[int(entry[0])] -= 1

    def _least_in_flight(self) -> int:
        loads = self.in_flight
        return loads.index(min(loads))

    def _choose(self, session: str, now: float) -> int:
        policy = self.policy
        if policy == "consistent_hash":
            assert self._ring is not None
            box = self._ring_memo.get(session)
            if box is None:
                box = self._ring_memo[session] = self._ring.lookup(session)
            return box
        if policy == "sticky_least_loaded":
            return self._sticky_least_loaded(session, now)
        if policy == "power_of_two":
            if self.n == 1:
                return 0
            first = self.rng.randrange(self.n)
            second = self.rng.randrange(self.n - 1)
            second += second >= first
            return first if self.in_flight[first] <= self.in_flight[second] else second
        if policy == "cache_aware":
            # Imbalanced or not, a glm53 fleet ends on the least-loaded branch (no token ids to match).
            return self._least_in_flight()
        if policy == "round_robin":
            box = self._next % self.n
            self._next += 1
            return box
        return self.rng.randrange(self.n)

    def _sticky_least_loaded(self, session: str, now: float) -> int:
        if now - self._last_sweep >= SLL_SWEEP_INTERVAL_S:
            stale = [s for s, (_, seen) in self.sessions.items() if now - seen >= SLL_SESSION_EXPIRATION_S]
            for s in stale:
                self.finish_session(s)
            self._last_sweep = now
        entry = self.sessions.get(session)
        if entry is not None:
            entry[1] = now
            return int(entry[0])
        counts = self.open_sessions
        low = min(counts)
        candidates = [i for i, c in enumerate(counts) if c == low]
        box = candidates[0] if len(candidates) == 1 else rendezvous_pick(session, self.urls, candidates)
        self.sessions[session] = [float(box), now]
        counts[box] += 1
        return box


@dataclass
class TurnResult:
    turn: Turn
    sent_s: float
    box: int
    started_s: float
    done_s: float
    uncached_tokens: float

    @property
    def latency_s(self) -> float:
        return self.done_s - self.sent_s

    @property
    def wait_s(self) -> float:
        return self.started_s - self.sent_s


@dataclass
class Outcome:
    """One simulated run: its measured turns and what the boxes did."""

    boxes: int
    results: list[TurnResult]
    busy_s: list[float]
    horizon_s: float
    users: int
    measured_from: int = 0  # results before this index are the warm-up
    sessions_per_box: list[int] = field(default_factory=list)

    @property
    def measured(self) -> list[TurnResult]:
        return self.results[self.measured_from :]

    def latencies(self) -> list[float]:
        return sorted(r.latency_s for r in self.measured)

    def p(self, q: float) -> float:
        return quantile(self.latencies(), q)

    @property
    def cache_hit(self) -> float:
        """Share of prompt tokens found in cache, over the measured turns."""
        turns = self.measured
        prompt = sum(r.turn.prompt_tokens for r in turns)
        return 1.0 - sum(r.uncached_tokens for r in turns) / prompt if prompt > 0 else 1.0

    @property
    def pace_turns_per_min(self) -> float:
        """Turns a user gets through per minute: each user's gaps between measured turns, pooled. (One span for
        all users would count the slowest user's end for everyone: a user who has sent all its turns stops,
        and the pace would read low by the users already done.)"""
        sent: dict[int, list[float]] = {}
        for r in self.measured:
            sent.setdefault(r.turn.user, []).append(r.sent_s)
        gaps = sum(len(times) - 1 for times in sent.values())
        span = sum(max(times) - min(times) for times in sent.values())
        return 60.0 * gaps / span if span > 0 else 0.0

    @property
    def max_wait_s(self) -> float:
        return max((r.wait_s for r in self.measured), default=0.0)

    @property
    def busiest_box_utilization(self) -> float:
        return max(self.busy_s) / self.horizon_s if self.horizon_s > 0 else 0.0

    @property
    def utilization(self) -> float:
        return sum(self.busy_s) / (self.horizon_s * self.boxes) if self.horizon_s > 0 else 0.0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def simulate(
    workload: Workload,
    service: Service,
    policy: RouterPolicy,
    urls: Sequence[str],
    *,
    finish_sessions: bool = True,
    total_turns: int | None = None,
    turns_per_user: int | None = None,
    warmup: float = 0.05,
    on_turn: Callable[[TurnResult], None] | None = None,
) -> Outcome:
    """Run users against the router and the boxes until `total_turns` turns were sent (or each user sent
    `turns_per_user`), then let every sent turn finish. The first `warmup` share of the turns (in the order
    sent) starts from empty boxes and is left out of the measures."""
    if (total_turns is None) == (turns_per_user is None):
        raise ValueError("give total_turns or turns_per_user")
    n = len(urls)
    router = Router(policy, urls, workload.seed)
    book = turn_book(workload)
    sent_by_user = [0] * workload.users
    budget = total_turns if total_turns is not None else workload.users * (turns_per_user or 0)
    queues: list[deque[tuple[Turn, float]]] = [deque() for _ in range(n)]
    running: list[tuple[Turn, float, float, float] | None] = [None] * n
    caches: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(n)]
    busy = [0.0] * n
    results: list[TurnResult] = []
    order: dict[tuple[int, int], int] = {}  # (user, index) -> place in the send order
    events: list[tuple[float, int, int, int]] = []  # (time, tiebreak, kind, who): kind 0 send (user), 1 done (box)
    seq = 0
    sent = 0
    capacity = max(1, service.cached_conversations)
    prefill, decode, hit = service.prefill_tok_s, service.decode_tok_s, service.cache_hit
    pending: list[Turn | None] = [None] * workload.users

    def push(time: float, kind: int, who: int) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, who))
        seq += 1

    def may_send(user: int) -> bool:
        if turns_per_user is not None:
            return sent_by_user[user] < turns_per_user
        return sent < budget

    def schedule(user: int, now: float) -> None:
        if not may_send(user):
            return
        turn = book.turn(user, sent_by_user[user])
        pending[user] = turn
        push(now + turn.think_s, 0, user)

    def start(box: int, now: float) -> None:
        turn, sent_at = queues[box].popleft()
        cache = caches[box]
        warm = turn.opens or turn.session in cache
        uncached = turn.prompt_tokens * (1.0 - hit) if warm else turn.prompt_tokens
        cache[turn.session] = None
        cache.move_to_end(turn.session)
        if len(cache) > capacity:
            cache.popitem(last=False)
        took = uncached / prefill + turn.answer_tokens / decode
        running[box] = (turn, sent_at, now, uncached)
        busy[box] += took
        push(now + took, 1, box)

    for user in range(workload.users):
        schedule(user, 0.0)
    now = 0.0
    while events:
        now, _, kind, who = heapq.heappop(events)
        if kind == 0:
            turn = pending[who]
            assert turn is not None
            pending[who] = None
            sent_by_user[who] += 1
            order[(who, turn.index)] = sent
            sent += 1
            box = router.route(turn.session, now)
            queues[box].append((turn, now))
            if running[box] is None:
                start(box, now)
            if workload.traffic == "open":
                schedule(who, now)
            continue
        box = who
        current = running[box]
        assert current is not None
        turn, sent_at, started, uncached = current
        running[box] = None
        router.done(box)
        result = TurnResult(turn, sent_at, box, started, now, uncached)
        results.append(result)
        if on_turn is not None:
            on_turn(result)
        if turn.closes and finish_sessions:
            router.finish_session(turn.session)  # the client's POST /finish_session after its last turn
        if workload.traffic == "closed":
            schedule(turn.user, now)
        if queues[box]:
            start(box, now)
    results.sort(key=lambda r: order[(r.turn.user, r.turn.index)])
    return Outcome(
        boxes=n,
        results=results,
        busy_s=busy,
        horizon_s=now,
        users=workload.users,
        measured_from=int(len(results) * warmup),
        sessions_per_box=list(router.open_sessions),
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


__all__ = [
    "ROUTER_POLICIES",
    "STICKY_POLICIES",
    "Outcome",
    "Router",
    "RouterPolicy",
    "Service",
    "TrafficModel",
    "Turn",
    "TurnBook",
    "TurnResult",
    "Workload",
    "default_urls",
    "quantile",
    "simulate",
    "turn_book",
    "user_turns",
]
