"""`glm53 fleet plan`: boxes needed for a p95 turn-latency target, from the recipe's figures (a seeded
queueing simulation; glm53.router.capacity)."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from glm53.cli.options import JsonOpt
from glm53.errors import BadInput, CheckFailed, invalid_document
from glm53.output import Output
from glm53.router.capacity import POLICIES, PROFILES, Plan, PlanInputs, plan_fleet

fleet_app = typer.Typer(no_args_is_help=True, help="Size a fleet of glm53 boxes behind the router.")


@fleet_app.command("plan")
def plan_cmd(
    users: Annotated[int, typer.Option("--users", min=1, help="Agent users sending turns.", show_default=False)],
    turns_per_min: Annotated[
        float, typer.Option("--turns-per-min", help="Turns per user per minute (Poisson).", show_default=False)
    ],
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", min=0, help="Prompt tokens per turn (the conversation resent).")
    ] = 16_384,
    answer_tokens: Annotated[int, typer.Option("--answer-tokens", min=1, help="Generated tokens per turn.")] = 300,
    p95_seconds: Annotated[
        float, typer.Option("--p95-seconds", help="Target: 95% of turns done within this (queueing included).")
    ] = 60.0,
    context: Annotated[
        int | None,
        typer.Option("--context", min=1, help="Context for the rates (default: --prompt-tokens).", show_default=False),
    ] = None,
    cache_hit: Annotated[
        float, typer.Option("--cache-hit", help="Share of prompt tokens in the prefix cache (recipe: 0.729).")
    ] = 0.729,
    cv: Annotated[float, typer.Option("--cv", help="Variation of prompt and answer lengths (1: exponential).")] = 0.5,
    session_turns: Annotated[
        int, typer.Option("--session-turns", help="Turns per conversation (one X-Session-ID, one box when sticky).")
    ] = 20,
    policy: Annotated[
        str, typer.Option("--policy", help="sticky (the router's consistent_hash) or jsq (join-shortest-queue).")
    ] = "sticky",
    profile: Annotated[str, typer.Option("--profile", help="Recipe figures: agent-256k or prefill-256k.")] = (
        "agent-256k"
    ),
    turns: Annotated[int, typer.Option("--turns", help="Turns simulated per box count.")] = 20_000,
    max_boxes: Annotated[int, typer.Option("--max-boxes", help="Largest fleet tried.")] = 512,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulation (same seed, same answer).")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Boxes needed so that 95% of agent turns finish within --p95-seconds, queueing included.

    A seeded discrete-event simulation over the recipe's measured rates (decode 48-50 tok/s, prefill 513-1,155
    tok/s by context), one turn per box at a time; the assumptions are printed with the answer. Exit 1 when no
    number of boxes meets the target.

    Example: glm53 fleet plan --users 20 --turns-per-min 2 --p95-seconds 60
    """
    if policy not in POLICIES:
        raise BadInput(f"--policy {policy!r} is not one of {', '.join(POLICIES)}", hint="e.g. --policy sticky")
    if profile not in PROFILES:
        raise BadInput(f"--profile {profile!r} is not one of {', '.join(PROFILES)}", hint="e.g. --profile agent-256k")
    flags = {
        "users": "--users",
        "turns_per_min": "--turns-per-min",
        "prompt_tokens": "--prompt-tokens",
        "answer_tokens": "--answer-tokens",
        "p95_seconds": "--p95-seconds",
        "context": "--context",
        "cache_hit": "--cache-hit",
        "cv": "--cv",
        "session_turns": "--session-turns",
        "turns": "--turns",
        "max_boxes": "--max-boxes",
    }
    try:
        inputs = PlanInputs(
            users=users,
            turns_per_min=turns_per_min,
            prompt_tokens=prompt_tokens,
            answer_tokens=answer_tokens,
            p95_seconds=p95_seconds,
            context=context,
            cache_hit=cache_hit,
            cv=cv,
            session_turns=session_turns,
            policy=policy,  # type: ignore[arg-type]  # checked above
            profile=profile,
            turns=turns,
            seed=seed,
            max_boxes=max_boxes,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        if field in flags:
            raise BadInput(f"{flags[field]}: {first['msg']}", hint="glm53 fleet plan --help") from exc
        raise invalid_document(exc, "fleet plan") from exc
    result = plan_fleet(inputs)
    out = Output(json_mode=json_out)
    out.result(result, lambda console: render_plan(console, result))
    if not result.meets:
        raise CheckFailed(result.reason or "no fleet meets the target", hint="see the assumptions printed above")


def render_plan(console: Console, plan: Plan) -> None:
    i = plan.inputs
    table = Table(
        "boxes", "utilization", "busiest box", "p50 s", "p95 s", "p99 s", "max wait s", "meets",
        title=(
            f"{i.users} users x {i.turns_per_min:g} turns/min = {plan.arrival_rate_per_s * 60:,.1f} turns/min; "
            f"p95 target {i.p95_seconds:g} s; policy {i.policy}"
        ),
    )  # fmt: skip
    for c in plan.candidates:
        table.add_row(
            ("[bold]" if c.boxes == plan.boxes else "") + str(c.boxes),
            f"{c.utilization:.0%}",
            f"{c.busiest_box_utilization:.0%}",
            f"{c.p50_s:,.1f}",
            f"{c.p95_s:,.1f}",
            f"{c.p99_s:,.1f}",
            f"{c.max_wait_s:,.1f}",
            "[green]yes[/green]" if c.meets else "[red]no[/red]",
        )
    console.print(table)
    console.print(
        f"a turn alone: mean {plan.mean_service_s:.1f} s, p95 {plan.p95_service_s:.1f} s; "
        f"offered load {plan.offered_load_boxes:.2f} boxes busy on average"
    )
    if plan.boxes is not None:
        console.print(f"[bold]answer: {plan.boxes} boxes[/bold] (p95 {_p95(plan):.1f} s <= {i.p95_seconds:g} s)")
    else:
        console.print(f"[bold red]no answer:[/bold red] {plan.reason}")
    console.print("assumptions:")
    for line in plan.assumptions:
        console.print(f"  - {line}", highlight=False)


def _p95(plan: Plan) -> float:
    return next(c.p95_s for c in plan.candidates if c.boxes == plan.boxes)


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")
