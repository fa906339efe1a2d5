"""`glm53 fleet plan`: the simulation (glm53.router.simulation), the capacity model (glm53.router.capacity)
and its command. tests/test_fleet_router.py holds both against the real router."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from glm53.router.capacity import PlanInputs, agent_rates, plan_fleet, rates_at, recipe_points
from glm53.router.simulation import (
    SLL_SESSION_EXPIRATION_S,
    Outcome,
    Router,
    Service,
    Workload,
    default_urls,
    simulate,
)
from tests.support.cli import CliResult, run_glm53

SERVICE = Service(prefill_tok_s=783.0, decode_tok_s=37.5, cache_hit=0.729, cached_conversations=16)


def fleet(*args: str) -> CliResult:
    return run_glm53("fleet", *args)


def workload(users: int, think_s: float, **changes: object) -> Workload:
    base: dict[str, object] = {
        "users": users,
        "think_s": think_s,
        "prompt_tokens": 16_384,
        "answer_tokens": 300,
        "cv": 0.5,
        "session_turns": 20,
        "seed": 0,
    }
    return Workload(**{**base, **changes})  # type: ignore[arg-type]


def test_rates_come_from_the_recipe_and_decode_from_its_real_agent_turns() -> None:
    points = recipe_points("agent-256k")
    assert [(p.context, p.prefill_tok_s, p.decode_tok_s) for p in points] == [
        (8192, 859, 50.4),
        (131072, 555, 49.3),
        (260096, 513, 48.1),
    ]
    assert rates_at(points, 1000).prefill_tok_s == 859  # clamped below the first point
    mid = rates_at(points, 32768)
    assert 555 < mid.prefill_tok_s < 859 and 49.3 < mid.decode_tok_s < 50.4
    # Not the best decode (50.4): the recipe's 37.7 tok/s on real agent turns, lower still at longer contexts.
    inputs = PlanInputs(users=1, turns_per_min=1)
    assert agent_rates(inputs, 8192).decode_tok_s == pytest.approx(37.7)
    assert 37.0 < agent_rates(inputs, 16_384).decode_tok_s < 37.7
    assert agent_rates(inputs.model_copy(update={"decode_tok_s": 50.0}), 8192).decode_tok_s == 50.0


def test_one_box_open_loop_matches_m_m_1() -> None:
    # Poisson arrivals (3 users x 1/min = 0.05/s), exponential service of mean 504 / 50.4 = 10 s (mu = 0.1/s), all
    # cached: the sojourn time is exponential with rate mu - lambda.
    service = Service(prefill_tok_s=1.0, decode_tok_s=50.4, cache_hit=1.0, cached_conversations=1)
    w = workload(3, 60.0, prompt_tokens=0, answer_tokens=504, cv=1.0, traffic="open", seed=7)
    run = simulate(w, service, "random", default_urls(1), total_turns=40_000)
    rate = 0.1 - 0.05
    assert run.utilization == pytest.approx(0.5, rel=0.04)
    assert run.p(0.95) == pytest.approx(math.log(20) / rate, rel=0.07)
    assert run.p(0.50) == pytest.approx(math.log(2) / rate, rel=0.07)


def test_one_box_closed_loop_matches_mean_value_analysis() -> None:
    # N users thinking Z on average, one FIFO box of exponential service S: the exact mean response time by
    # mean value analysis (a closed product-form network).
    users, think, mean_s = 6, 40.0, 10.0
    service = Service(prefill_tok_s=1.0, decode_tok_s=30.0, cache_hit=1.0, cached_conversations=1)
    w = workload(users, think, prompt_tokens=0, answer_tokens=300, cv=1.0, seed=3)
    run = simulate(w, service, "random", default_urls(1), total_turns=30_000)
    queue = 0.0
    for n in range(1, users + 1):
        response = mean_s * (1 + queue)
        throughput = n / (response + think)
        queue = throughput * response
    measured = sum(r.latency_s for r in run.measured) / len(run.measured)
    assert measured == pytest.approx(response, rel=0.04)
    assert run.pace_turns_per_min == pytest.approx(60 * throughput / users, rel=0.04)


def test_closed_loop_users_wait_for_each_answer_and_open_loop_ones_do_not() -> None:
    closed = simulate(workload(6, 5.0), SERVICE, "sticky_least_loaded", default_urls(2), total_turns=600)
    open_ = simulate(workload(6, 5.0, traffic="open"), SERVICE, "sticky_least_loaded", default_urls(2), total_turns=600)

    def overlaps(run: Outcome) -> int:
        """Turns sent before the same user's previous answer came."""
        by_user: dict[int, list[tuple[float, float]]] = {}
        for r in sorted(run.results, key=lambda r: (r.turn.user, r.turn.index)):
            by_user.setdefault(r.turn.user, []).append((r.sent_s, r.done_s))
        return sum(1 for spans in by_user.values() for (_, done), (sent, _) in itertools.pairwise(spans) if sent < done)

    assert overlaps(closed) == 0
    assert overlaps(open_) > 100  # a 5 s think on 14 s turns: open-loop turns pile up behind each other
    assert closed.pace_turns_per_min < 60 / (5.0 + 13.0)  # users get less than they would with instant answers


def test_sticky_least_loaded_balances_open_sessions_and_forgets_idle_ones() -> None:
    urls = default_urls(4)
    router = Router("sticky_least_loaded", urls, seed=0)
    boxes = [router.route(f"s{i}", now=0.0) for i in range(10)]
    assert sorted(router.open_sessions) == [2, 2, 3, 3]
    assert router.route("s3", now=1.0) == boxes[3]  # a session stays on its box
    # POST /finish_session on a box with two: it is then the least loaded, and the next new session goes there.
    closing = next(f"s{i}" for i, box in enumerate(boxes) if router.open_sessions[box] == 2)
    router.finish_session(closing)
    assert router.route("new", now=2.0) == boxes[int(closing[1:])]
    # Without /finish_session a session counts until idle for 2 hours (swept at most once a minute).
    router.route("late", now=SLL_SESSION_EXPIRATION_S + 100.0)
    assert sum(router.open_sessions) == 1 and list(router.sessions) == ["late"]


def test_consistent_hash_sessions_pile_up_where_sticky_least_loaded_spreads_them() -> None:
    w = workload(20, 30.0)
    sll = simulate(w, SERVICE, "sticky_least_loaded", default_urls(8), total_turns=1500)
    ring = simulate(w, SERVICE, "consistent_hash", default_urls(8), total_turns=1500)
    assert sll.busiest_box_utilization < ring.busiest_box_utilization
    assert sll.p(0.95) < ring.p(0.95)


def test_the_prefix_cache_hit_is_what_each_policy_keeps() -> None:
    hits = {}
    for policy in ("sticky_least_loaded", "consistent_hash", "round_robin", "random", "cache_aware"):
        hits[policy] = simulate(workload(20, 30.0), SERVICE, policy, default_urls(8), total_turns=1500).cache_hit
    assert hits["sticky_least_loaded"] == pytest.approx(0.729) and hits["consistent_hash"] == pytest.approx(0.729)
    assert all(hits[p] < 0.65 for p in ("round_robin", "random", "cache_aware")), hits
    many = simulate(workload(80, 30.0), SERVICE, "round_robin", default_urls(30), total_turns=3000).cache_hit
    assert many < hits["round_robin"] - 0.1  # more conversations than a box's cache holds: fewer hits


def test_the_answer_holds_for_every_seed_and_shows_its_spread() -> None:
    inputs = PlanInputs(users=12, turns_per_min=2, policy="consistent_hash", seeds=4, turns=800)
    plan = plan_fleet(inputs)
    assert plan == plan_fleet(inputs)  # same seeds, same answer
    (policy,) = plan.policies
    assert plan.meets and plan.boxes is not None and policy.boxes_spread is not None
    assert len(policy.boxes_by_seed) == 4 and max(b or 0 for b in policy.boxes_by_seed) <= plan.boxes
    assert policy.boxes_spread.low <= policy.boxes_spread.median <= policy.boxes_spread.high <= plan.boxes
    rows = {c.boxes: c for c in policy.candidates}
    assert rows[plan.boxes].meets and rows[plan.boxes].seeds_meeting == 4 and rows[plan.boxes].p95_s.high <= 60
    if plan.boxes > 1:
        assert not rows[plan.boxes - 1].meets  # one box fewer misses for some seed
    assert rows[plan.boxes].pace_turns_per_min.low >= 0.9 * 2  # the pace target holds on every seed


def test_twenty_users_at_two_turns_a_minute_get_the_pace_and_the_p95() -> None:
    """The defaults (10 seeds, 4,000 turns): on every seed users get >= 1.8 turns/min and p95 <= 60 s."""
    plan = plan_fleet(PlanInputs(users=20, turns_per_min=2))
    assert plan.meets and plan.boxes is not None
    # the pace asked is kept when answers take their unloaded time: think = 60/R - an unloaded turn
    assert plan.think_s == pytest.approx(30.0 - plan.mean_service_s)
    assert plan.pace_target_turns_per_min == pytest.approx(1.8) and plan.pace_note is None
    (policy,) = plan.policies
    rows = {c.boxes: c for c in policy.candidates}
    answer = rows[plan.boxes]
    assert answer.pace_turns_per_min.low >= 1.8 and answer.p95_s.high <= 60
    assert answer.seeds_meeting == 10 and answer.p95_meets and answer.pace_meets
    # the p95 alone is met by far fewer boxes: the pace decided the answer, and one box fewer misses it
    assert policy.decided_by == "pace" and policy.p95_only_boxes is not None and policy.p95_only_boxes < plan.boxes
    assert rows[plan.boxes - 1].p95_meets and not rows[plan.boxes - 1].pace_meets


def test_a_loose_pace_leaves_the_p95_to_decide() -> None:
    plan = plan_fleet(PlanInputs(users=12, turns_per_min=1, min_pace=0.3, p95_seconds=30, seeds=3, turns=800))
    (policy,) = plan.policies
    assert plan.meets and policy.decided_by == "p95" and policy.p95_only_boxes == plan.boxes


def test_a_pace_beyond_an_idle_fleet_is_said_and_planned_at_what_can_be_reached() -> None:
    # a turn alone takes about 13.6 s: 4.5 a minute cannot be kept, but 90% of it (4.05) can
    plan = plan_fleet(PlanInputs(users=4, turns_per_min=4.5, seeds=2, turns=600))
    assert plan.think_s == 0.0
    assert plan.pace_note is not None and "even an idle fleet gives a user at most 4." in plan.pace_note
    assert plan.meets
    result = fleet("plan", "--users", "4", "--turns-per-min", "4.5", "--seeds", "2", "--turns", "600")
    assert result.code == 0 and "note:" in result.stdout


def test_a_pace_no_fleet_can_give_is_exit_1_with_the_pace_that_can() -> None:
    result = fleet("plan", "--users", "4", "--turns-per-min", "6", "--json")
    assert result.code == 1
    data = json.loads(result.stdout)
    assert data["meets"] is False and data["policies"] == []
    assert "even an idle fleet gives a user at most 4." in result.stderr
    assert "(--min-pace); ask for at most 4." in result.stderr


def test_a_rate_beyond_the_search_bound_names_max_boxes() -> None:
    result = fleet("plan", "--users", "80", "--turns-per-min", "2", "--max-boxes", "4", "--seeds", "2",
                   "--turns", "600")  # fmt: skip
    assert result.code == 1
    assert "no box count up to 4 meets" in result.stderr and "--max-boxes allows (raise it)" in result.stderr


def test_the_table_marks_the_target_that_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    result = fleet("plan", "--users", "20", "--turns-per-min", "2", "--seeds", "2", "--turns", "800")
    assert result.code == 0, result.stderr
    assert "pace turns/min*" in result.stdout and "p95 s*" not in result.stdout
    assert "the pace decided it (the p95 alone would take" in result.stdout
    assert "pace >= 1.80 turns/min (90% of 2)" in result.stdout


def test_more_users_never_need_fewer_boxes() -> None:
    needed = []
    for users in (1, 4, 12, 24):
        plan = plan_fleet(PlanInputs(users=users, turns_per_min=2, seeds=2, turns=600))
        assert plan.meets and plan.boxes is not None
        needed.append(plan.boxes)
    assert needed == sorted(needed) and needed[-1] > needed[0], needed


def test_compare_plans_every_real_policy_and_recommends_sticky_least_loaded() -> None:
    plan = plan_fleet(PlanInputs(users=12, turns_per_min=2, compare=True, seeds=2, turns=800))
    labels = [p.label for p in plan.policies]
    assert labels == [
        "sticky_least_loaded",
        "sticky_least_loaded (no /finish_session)",
        "consistent_hash",
        "cache_aware",
        "power_of_two",
        "round_robin",
        "random",
    ]
    boxes = {p.label: p.boxes for p in plan.policies}
    assert plan.recommended == plan.policy == "sticky_least_loaded" and plan.boxes == boxes["sticky_least_loaded"]
    assert all(b is None or b >= plan.boxes for b in boxes.values()), boxes


def test_json_is_strict_and_states_its_assumptions() -> None:
    result = fleet("plan", "--users", "8", "--turns-per-min", "2", "--seeds", "2", "--turns", "600", "--json")
    assert result.code == 0, result.stderr

    def refuse(value: str) -> None:
        raise ValueError(value)

    data = json.loads(result.stdout, parse_constant=refuse)
    assert data["meets"] is True and data["boxes"] >= 1 and data["policy"] == "sticky_least_loaded"
    assert data["inputs"]["cache_hit"] == 0.729 and data["inputs"]["traffic"] == "closed"
    assert data["rates"]["decode_tok_s"] < 38
    assert any("max_num_seqs=1" in line for line in data["assumptions"])
    assert any("closed loop" in line for line in data["assumptions"])
    assert any("/finish_session" in line for line in data["assumptions"])
    chosen = [c for c in data["policies"][0]["candidates"] if c["boxes"] == data["boxes"]]
    assert chosen[0]["meets"] and chosen[0]["p95_s"]["high"] <= 60


def test_the_table_shows_the_answer_its_spread_and_the_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = fleet("plan", "--users", "4", "--turns-per-min", "1", "--seeds", "3", "--turns", "400")
    assert result.code == 0, result.stderr
    assert "answer:" in result.stdout and "per-seed answers" in result.stdout and "turns/min" in result.stdout
    assert "assumptions:" in result.stdout and "sticky_least_loaded" in result.stdout


def test_open_loop_is_a_named_traffic_model() -> None:
    result = fleet("plan", "--users", "4", "--turns-per-min", "1", "--traffic", "open", "--seeds", "2",
                   "--turns", "400", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    assert any(line.startswith("open loop") for line in result.json()["assumptions"])


def test_an_unreachable_target_is_exit_1_with_the_reason() -> None:
    result = fleet("plan", "--users", "2", "--turns-per-min", "1", "--p95-seconds", "5", "--json")
    assert result.code == 1
    assert json.loads(result.stdout)["meets"] is False
    assert "a turn alone takes" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--users", "0", "--turns-per-min", "1"], "--users"),
        (["--users", "2", "--turns-per-min", "0"], "--turns-per-min"),
        (["--users", "2", "--turns-per-min", "nan"], "--turns-per-min"),
        (["--users", "2", "--turns-per-min", "1", "--cache-hit", "1.5"], "--cache-hit"),
        (["--users", "2", "--turns-per-min", "1", "--p95-seconds", "-1"], "--p95-seconds"),
        (["--users", "2", "--turns-per-min", "1", "--policy", "jsq"], "--policy"),  # not a vllm-router policy
        (["--users", "2", "--turns-per-min", "1", "--traffic", "poisson"], "--traffic"),
        (["--users", "2", "--turns-per-min", "1", "--figures", "nope"], "--figures"),
        (["--users", "2", "--turns-per-min", "1", "--context", "100"], "--context"),
        (["--users", "2", "--turns-per-min", "1", "--prompt-tokens", "300000"], "--prompt-tokens"),
        (["--users", "2", "--turns-per-min", "1", "--seeds", "0"], "--seeds"),
        (["--users", "2", "--turns-per-min", "1", "--min-pace", "0"], "--min-pace"),
        (["--users", "2", "--turns-per-min", "1", "--min-pace", "1.5"], "--min-pace"),
        (["--users", "2", "--turns-per-min", "1", "--min-pace", "nan"], "--min-pace"),
        (["--turns-per-min", "1"], "--users"),
    ],
)
def test_bad_input_is_exit_2(args: list[str], message: str) -> None:
    result = fleet("plan", *args)
    assert result.code == 2, (args, result.stdout, result.stderr)
    assert message in result.stderr, result.stderr


def test_the_pace_of_users_who_never_wait_is_their_interval() -> None:
    """On a fleet with a box per user no turn waits: each user sends every think + turn seconds. The pace is
    pooled over each user's own span (users who sent all their turns stop; one span for all would read low)."""
    users, think = 40, 106.4
    w = workload(users, think)
    run = simulate(w, SERVICE, "sticky_least_loaded", default_urls(users), total_turns=2000)
    mean_turn = sum(r.latency_s for r in run.measured) / len(run.measured)
    assert max(r.wait_s for r in run.measured) == 0
    assert run.pace_turns_per_min == pytest.approx(60 / (think + mean_turn), rel=0.03)
