"""`glm53 fleet plan --compare` over a grid of teams: which router policy needs the fewest boxes, and how many.

For 5, 20 and 80 agent users at 0.5 to 6 turns a minute (closed loop: send, wait, think), every vllm-router
0.1.17 policy is planned over the seeds; the table shows the recommended policy, its box count (the fewest
meeting the p95 target for every seed) with the median and range of the per-seed answers, its p95 and the pace
users get, and the best of the other policies. docs/scale-out.md quotes this table.

    python benchmarks/bench_fleet_grid.py [--users 5 20 80] [--turns-per-min 0.5 1 2 4 6] [--seeds 10] [--jobs N]
                                          [--json > plans.jsonl]
    python benchmarks/bench_fleet_grid.py --from plans.jsonl [--markdown]   # the table again, from saved plans
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from glm53.router.capacity import FleetPlan, PlanInputs, Spread, plan_fleet, recommend


def _spread(median: float, low: float, high: float, fmt: str) -> str:
    if abs(high - low) < 1e-9:
        return f"{median:{fmt}}"
    return f"{median:{fmt}} ({low:{fmt}}-{high:{fmt}})"


MARKDOWN_HEAD = [
    "| users | turns/min | policy | boxes | per seed | decided by | p95 s | pace, turns/min "
    "| consistent_hash (per seed) | cache_aware | round_robin | power_of_two | random |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def _s(s: Spread, fmt: str) -> str:
    return _spread(s.median, s.low, s.high, fmt)


def _markdown_row(plan: FleetPlan) -> str:
    """The recommended policy's answer, then each other policy's boxes and the cache hit it keeps."""
    best = recommend(plan.policies)
    by_label = {p.label: p for p in plan.policies}

    def other(label: str, per_seed: bool = False) -> str:
        p = by_label[label]
        if p.boxes is None or p.chosen is None:
            return "none"
        seeds = f" ({_s(p.boxes_spread, 'g')})" if per_seed and p.boxes_spread is not None else ""
        return f"{p.boxes}{seeds}, {p.chosen.cache_hit.median:.0%} hit"

    head = f"| {plan.inputs.users} | {plan.inputs.turns_per_min:g} "
    if best is None or best.chosen is None or best.boxes_spread is None:
        return head + f"| none: {plan.reason} |" + " |" * 11
    c = best.chosen
    decided = "pace" if best.decided_by == "pace" else "p95"
    if best.decided_by == "pace":
        decided += f" (p95 alone: {best.p95_only_boxes})"
    return (
        head + f"| {best.label} | **{best.boxes}** | {_s(best.boxes_spread, 'g')} | {decided} | {_s(c.p95_s, '.1f')} "
        f"| {_s(c.pace_turns_per_min, '.2f')} | {other('consistent_hash', per_seed=True)} | "
        + " | ".join(other(label) for label in ("cache_aware", "round_robin", "power_of_two", "random"))
        + " |"
    )


def _plan(inputs: PlanInputs) -> FleetPlan:
    return plan_fleet(inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, nargs="+", default=[5, 20, 80])
    parser.add_argument("--turns-per-min", type=float, nargs="+", default=[0.5, 1, 2, 4, 6])
    parser.add_argument("--p95-seconds", type=float, default=60.0)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--turns", type=int, default=4000)
    parser.add_argument("--jobs", type=int, default=1, help="teams planned at once, one process each")
    parser.add_argument("--json", action="store_true", help="every plan as a JSON line, as it is done")
    parser.add_argument("--from", dest="saved", type=Path, help="print the table of plans saved with --json")
    parser.add_argument("--markdown", action="store_true", help="the table as docs/scale-out.md shows it")
    args = parser.parse_args()
    console = Console(width=160)
    table = Table(
        "users", "turns/min", "policy", "boxes (per seed)", "p95 s", "pace turns/min", "cache hit", "next best policy",
        title=f"closed loop, p95 target {args.p95_seconds:g} s, seeds 0-{args.seeds - 1}",
    )  # fmt: skip
    started = time.perf_counter()
    teams = [
        PlanInputs(
            users=users,
            turns_per_min=rate,
            p95_seconds=args.p95_seconds,
            seeds=args.seeds,
            turns=args.turns,
            compare=True,
        )
        for users in args.users
        for rate in args.turns_per_min
    ]
    rows: list[str] = []
    if args.saved is not None:
        lines = args.saved.read_text().splitlines()
        plans: Iterable[FleetPlan] = [FleetPlan.model_validate_json(line) for line in lines if line.strip()]
        pool = None
    else:
        pool = ProcessPoolExecutor(max_workers=max(1, args.jobs))
        plans = pool.map(_plan, teams)
    for plan in plans:
        if args.json:
            sys.stdout.write(json.dumps(plan.model_dump(mode="json")) + "\n")
            sys.stdout.flush()
            continue
        if args.markdown:
            rows.append(_markdown_row(plan))
            continue
        users, rate = plan.inputs.users, plan.inputs.turns_per_min
        best = recommend(plan.policies)
        others = [p for p in plan.policies if best is None or p.policy != best.policy]
        runner_up = recommend(others)
        c = best.chosen if best is not None else None
        if best is None or c is None or best.boxes_spread is None:
            table.add_row(str(users), f"{rate:g}", "-", "none", "-", "-", "-", plan.reason or "")
            continue
        s = best.boxes_spread
        table.add_row(
            str(users),
            f"{rate:g}",
            best.label,
            f"{best.boxes} ({_spread(s.median, s.low, s.high, 'g')})",
            _spread(c.p95_s.median, c.p95_s.low, c.p95_s.high, ".1f"),
            _spread(c.pace_turns_per_min.median, c.pace_turns_per_min.low, c.pace_turns_per_min.high, ".2f"),
            f"{c.cache_hit.median:.0%}",
            f"{runner_up.label} {runner_up.boxes}" if runner_up is not None else "-",
        )
    if pool is not None:
        pool.shutdown()
    if args.markdown:
        sys.stdout.write("\n".join([*MARKDOWN_HEAD, *rows]) + "\n")
    elif not args.json:
        console.print(table)
        console.print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
