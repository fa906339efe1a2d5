"""What the recipe's engine can reach at all: its one policy family (per-layer LRU with the hottest share of the
slots pinned by a learned ranking) at every pinned share, on the three trace shapes whose learning part is the
same (stationary, popularity re-permuted at 50% and at 85%: their first 20% is step for step the stationary
shape's on the same seed, so any setting chosen from it is chosen for all three).

    python benchmarks/bench_pinned_frontier.py [--seeds 0-4] [--steps 6000] [--layers 8] [--budget 0.17]

Per pinned share: the held-out hit rate minus plain LRU's on each shape (worst seed, points), and on stationary
minus the recipe's (20% pinned). The targets ask for both at once: at least the recipe + 4 points on
stationary, and never more than 0.25 points below LRU on the others.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from glm53.plan.cache.targets import SAME_LEARNING_PART, pinned_frontier
from glm53.plan.routing.traces import parse_layers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.17)
    args = parser.parse_args()
    console = Console(width=130)
    started = time.perf_counter()
    points = pinned_frontier(
        seeds=parse_layers(args.seeds, flag="--seeds"),
        fraction=args.budget,
        steps=args.steps,
        layers=tuple(range(3, 3 + args.layers)),
    )
    table = Table(
        title=f"Pinned LRU at {args.budget:.0%}: held-out hit rate vs plain LRU, worst seed (points)",
        title_justify="left",
    )
    for column in ("pinned", *(f"{shape} vs LRU" for shape in SAME_LEARNING_PART), "stationary vs recipe", "both"):
        table.add_column(column, justify="right")
    for point in points:
        table.add_row(
            f"{point.pinned_fraction:.0%}",
            *(f"{100 * min(point.gains[shape]):+.2f}" for shape in SAME_LEARNING_PART),
            f"{100 * min(point.over_recipe):+.2f}",
            "yes" if point.meets_both else "no",
        )
    console.print(table)
    reachable = [point for point in points if point.meets_both]
    console.print(
        f"{len(reachable)} of {len(points)} pinned shares meet both targets ({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
