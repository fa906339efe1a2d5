"""`glm53 fleet plan`: boxes needed for a p95 turn-latency target, from the recipe's agent figures (seeded
simulations of closed-loop agent users and vllm-router's policies; glm53.router.capacity)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from glm53.cli.app import App
from glm53.cli.model_options import Flag, options_from
from glm53.cli.options import JsonOpt
from glm53.errors import CheckFailed
from glm53.output import Output
from glm53.router.capacity import PlanInputs, plan_fleet

if TYPE_CHECKING:
    from rich.console import Console

    from glm53.router.capacity import FleetPlan, PolicyPlan, Spread

fleet_app = App(no_args_is_help=True, help="Size a fleet of glm53 boxes behind the router.")

FLAGS = {
    "profile": Flag("--figures"),
    # Clients close their sessions by default (glm53 bench agent does): the flag says when they do not.
    "finish_sessions": Flag(
        "--no-finish-sessions",
        help="Clients never POST /finish_session (glm53 bench agent does, after each conversation).",
        parse=lambda given: not given,
        show=lambda default: not default,
    ),
}


@fleet_app.command("plan")
@options_from(PlanInputs, "inputs", flags=FLAGS, fix="see `glm53 fleet plan --help`")
def plan_cmd(inputs: PlanInputs, json_out: JsonOpt = False) -> None:
    """Boxes needed so that 95% of agent turns finish within --p95-seconds, for every seed.

    Seeded simulations of agent users in closed loop (send, wait for the answer, think), vllm-router
    0.1.17's policies as it routes, and boxes serving one turn at a time, at the recipe's agent figures:
    decode 37.7 tok/s on real agent turns, prefill 513-859 tok/s by context, 72.9% of a prompt cached on
    the box holding its conversation. Prints the answer with its spread over the seeds, the pace users
    get, and the assumptions. The answer meets two targets on every seed: the p95 and the pace users get
    (at least --min-pace of --turns-per-min, the pace kept when answers take their unloaded time); the table
    marks which one decided it. Exit 1 when no number of boxes meets both.

    Examples:
      glm53 fleet plan --users 20 --turns-per-min 2 --compare
      glm53 fleet plan --users 80 --turns-per-min 1 --figures prefill-256k --json
    """
    result = plan_fleet(inputs)
    out = Output(json_mode=json_out)
    out.result(result, lambda console: render_plan(console, result))
    if not result.meets:
        raise CheckFailed(result.reason or "no fleet meets the target", fix="see the assumptions printed above")


def _spread(s: Spread, fmt: str = ",.1f", unit: str = "") -> str:
    if abs(s.high - s.low) < 1e-9:
        return f"{s.median:{fmt}}{unit}"
    return f"{s.median:{fmt}}{unit} ({s.low:{fmt}}-{s.high:{fmt}})"


def _boxes(p: PolicyPlan) -> str:
    if p.boxes is None:
        return "[red]none[/red]"
    if p.boxes_spread is None:
        return str(p.boxes)
    return f"{p.boxes} (per seed {_spread(p.boxes_spread, 'g')})"


def render_plan(console: Console, plan: FleetPlan) -> None:
    i = plan.inputs
    pace = f"pace >= {plan.pace_target_turns_per_min:.2f} turns/min ({i.min_pace:.0%} of {i.turns_per_min:g})"
    head = (
        f"{i.users} users, {i.traffic} loop, think {plan.think_s:.1f} s; targets: p95 <= {i.p95_seconds:g} s and "
        f"{pace}; seeds {i.seed}-{i.seed + i.seeds - 1}"
    )
    if len(plan.policies) > 1:
        table = Table(
            "policy", "boxes", "p95 s", "pace turns/min", "cache hit", "busiest box", title=head,
        )  # fmt: skip
        for p in plan.policies:
            c = p.chosen
            mark = "[bold]" if p.label == plan.recommended else ""
            table.add_row(
                mark + p.label,
                _boxes(p),
                _spread(c.p95_s) if c else "-",
                _spread(c.pace_turns_per_min, ".2f") if c else "-",
                f"{c.cache_hit.median:.0%}" if c else "-",
                f"{c.busiest_box_utilization.median:.0%}" if c else "-",
            )
        console.print(table)
        head = f"{plan.policy}: the box counts around the answer"
    chosen = next((p for p in plan.policies if p.label == plan.policy), None)
    if chosen is not None and chosen.candidates:
        # The target that set the answer is marked in its column's title.
        p95_title = "p95 s" + ("*" if chosen.decided_by == "p95" else "")
        pace_title = "pace turns/min" + ("*" if chosen.decided_by == "pace" else "")
        table = Table(
            "boxes", "p50 s", p95_title, "p99 s", pace_title, "cache hit", "busiest box", "seeds meeting",
            title=head if len(plan.policies) > 1 else f"{head}; policy {plan.policy}",
            caption="* the target that decided the answer; x: missed on some seed",
        )  # fmt: skip
        for c in chosen.candidates:
            table.add_row(
                ("[bold]" if c.boxes == plan.boxes else "") + str(c.boxes),
                _spread(c.p50_s),
                _spread(c.p95_s) + ("" if c.p95_meets else " [red]x[/red]"),
                _spread(c.p99_s),
                _spread(c.pace_turns_per_min, ".2f") + ("" if c.pace_meets else " [red]x[/red]"),
                f"{c.cache_hit.median:.0%}",
                f"{c.busiest_box_utilization.median:.0%}",
                f"{c.seeds_meeting}/{i.seeds}",
            )
        console.print(table)
    if plan.pace_note is not None:
        console.print(f"[yellow]note:[/yellow] {plan.pace_note} (users think 0 s)")
    console.print(
        f"a turn alone: mean {plan.mean_service_s:.1f} s, p95 {plan.p95_service_s:.1f} s; "
        f"{plan.offered_load_boxes:.1f} boxes busy if no turn ever waited"
    )
    if plan.boxes is not None and chosen is not None and (c := chosen.chosen) is not None:
        decided = (
            f"the pace decided it (the p95 alone would take {chosen.p95_only_boxes})"
            if chosen.decided_by == "pace"
            else "the p95 decided it"
        )
        console.print(
            f"[bold]answer: {plan.boxes} boxes[/bold] with {plan.policy} (per-seed answers "
            f"{_spread(chosen.boxes_spread, 'g') if chosen.boxes_spread else plan.boxes}); p95 {_spread(c.p95_s)} s "
            f"<= {i.p95_seconds:g} s; users get {_spread(c.pace_turns_per_min, '.2f')} turns/min >= "
            f"{plan.pace_target_turns_per_min:.2f}; {decided}"
        )
    else:
        console.print(f"[bold red]no answer:[/bold red] {plan.reason}")
    console.print("assumptions:")
    for line in plan.assumptions:
        console.print(f"  - {line}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")
