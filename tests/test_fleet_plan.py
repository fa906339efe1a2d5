"""`glm53 fleet plan`: the capacity model (glm53.router.capacity) and its command."""

from __future__ import annotations

import json
import math
import time

import pytest

from glm53.router.capacity import PlanInputs, plan_fleet, rates_at, recipe_points
from tests.support.cli import CliResult, run_glm53


def fleet(*args: str) -> CliResult:
    return run_glm53("fleet", *args)


def test_rates_come_from_the_recipe_by_context() -> None:
    points = recipe_points("agent-256k")
    assert [(p.context, p.prefill_tok_s, p.decode_tok_s) for p in points] == [
        (8192, 859, 50.4),
        (131072, 555, 49.3),
        (260096, 513, 48.1),
    ]
    assert rates_at(points, 1000).prefill_tok_s == 859  # clamped below the first point
    mid = rates_at(points, 32768)
    assert 555 < mid.prefill_tok_s < 859 and 49.3 < mid.decode_tok_s < 50.4
    assert rates_at(recipe_points("prefill-256k"), 131072).prefill_tok_s == 1155


def test_an_m_m_1_case_matches_the_closed_form() -> None:
    # One box, Poisson arrivals (lambda = 0.05/s), exponential service (cv 1, no prefill: all cached) of mean
    # 504 tokens / 50.4 tok/s = 10 s (mu = 0.1/s): the sojourn time is exponential with rate mu - lambda.
    inputs = PlanInputs(
        users=3, turns_per_min=1.0, prompt_tokens=0, context=8192, answer_tokens=504, cv=1.0,
        cache_hit=1.0, p95_seconds=10_000, policy="jsq", turns=100_000, seed=7,
    )  # fmt: skip
    plan = plan_fleet(inputs)
    one = plan.candidates[0]
    assert one.boxes == 1 and plan.boxes == 1
    assert plan.mean_service_s == pytest.approx(10.0, rel=0.02)
    assert one.utilization == pytest.approx(0.5, rel=0.03)
    rate = 0.1 - 0.05
    assert one.p95_s == pytest.approx(math.log(20) / rate, rel=0.06)
    assert one.p50_s == pytest.approx(math.log(2) / rate, rel=0.06)


@pytest.mark.parametrize("policy", ["sticky", "jsq"])
def test_more_users_never_need_fewer_boxes(policy: str) -> None:
    needed = []
    for users in (1, 3, 6, 12, 24):
        plan = plan_fleet(
            PlanInputs(users=users, turns_per_min=2, p95_seconds=60, policy=policy, turns=5000)  # type: ignore[arg-type]
        )
        assert plan.meets and plan.boxes is not None
        needed.append(plan.boxes)
    assert needed == sorted(needed) and needed[-1] > needed[0], needed


def test_seeded_fast_and_sticky_costs_boxes() -> None:
    inputs = PlanInputs(users=20, turns_per_min=2, p95_seconds=60)
    started = time.perf_counter()
    first = plan_fleet(inputs)
    elapsed = time.perf_counter() - started
    assert first == plan_fleet(inputs)  # same seed, same answer
    # Well under a second on a free core; the bound only catches a pathology, on cores other work shares.
    assert elapsed < 20.0, elapsed
    jsq = plan_fleet(inputs.model_copy(update={"policy": "jsq"}))
    assert first.boxes is not None and jsq.boxes is not None
    # Sessions pinned by a hash load some boxes twice: sticky needs more boxes than join-shortest-queue, which
    # needs at least the offered load.
    assert first.boxes > jsq.boxes >= math.ceil(first.offered_load_boxes)


def test_json_is_strict_and_states_its_assumptions() -> None:
    result = fleet("plan", "--users", "20", "--turns-per-min", "2", "--p95-seconds", "60", "--policy", "jsq", "--json")
    assert result.code == 0, result.stderr

    def refuse(value: str) -> None:
        raise ValueError(value)

    data = json.loads(result.stdout, parse_constant=refuse)
    assert data["meets"] is True and data["boxes"] >= 8
    assert data["inputs"]["cache_hit"] == 0.729 and data["inputs"]["policy"] == "jsq"
    assert any("max_num_seqs=1" in line for line in data["assumptions"])
    assert any("join-shortest-queue" in line for line in data["assumptions"])
    chosen = [c for c in data["candidates"] if c["boxes"] == data["boxes"]]
    assert chosen[0]["meets"] and chosen[0]["p95_s"] <= 60


def test_the_table_shows_the_answer_and_the_assumptions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = fleet("plan", "--users", "4", "--turns-per-min", "1", "--turns", "3000")
    assert result.code == 0, result.stderr
    assert "answer:" in result.stdout and "boxes" in result.stdout
    assert "assumptions:" in result.stdout and "consistent_hash" in result.stdout


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
        (["--users", "2", "--turns-per-min", "1", "--policy", "fastest"], "--policy"),
        (["--users", "2", "--turns-per-min", "1", "--figures", "nope"], "--figures"),
        (["--users", "2", "--turns-per-min", "1", "--context", "100"], "--context"),
        (["--users", "2", "--turns-per-min", "1", "--prompt-tokens", "300000"], "--prompt-tokens"),
        (["--turns-per-min", "1"], "--users"),
    ],
)
def test_bad_input_is_exit_2(args: list[str], message: str) -> None:
    result = fleet("plan", *args)
    assert result.code == 2, (args, result.stdout, result.stderr)
    assert message in result.stderr, result.stderr
