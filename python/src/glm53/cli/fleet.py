"""`glm53 fleet plan`: boxes needed for a p95 turn-latency target, from the recipe's figures (a seeded
queueing simulation; glm53.router.capacity)."""

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

    from glm53.router.capacity import Plan

fleet_app = App(no_args_is_help=True, help="Size a fleet of glm53 boxes behind the router.")


@fleet_app.command("plan")
@options_from(PlanInputs, "inputs", flags={"profile": Flag("--figures")}, hint="see `glm53 fleet plan --help`")
def plan_cmd(inputs: PlanInputs, json_out: JsonOpt = False) -> None:
    """Boxes needed so that 95% of agent turns finish within --p95-seconds, queueing included.

    A seeded discrete-event simulation over the recipe's measured rates (decode 48-50 tok/s, prefill 513-1,155
    tok/s by context), one turn per box at a time; the assumptions are printed with the answer. Exit 1 when no
    number of boxes meets the target.

    Examples:
      glm53 fleet plan --users 20 --turns-per-min 2 --p95-seconds 60
      glm53 fleet plan --users 50 --turns-per-min 1 --policy jsq --figures prefill-256k --json
    """

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
