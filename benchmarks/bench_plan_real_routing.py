"""The engines' policies on real routing: each trace learned on its first 20%, every engine's recommendation
and baseline replayed over the whole and scored on the rest, beside Belady's MIN. `exl3-cache` is glm53's GPU
expert cache in ExLlamaV3 (the policies its kernel runs).

    python benchmarks/bench_plan_real_routing.py TRACE [TRACE...] [--budgets 0.25,0.375,0.5]

Traces come from `glm53 plan trace import` (docs/plan.md, "Real routing"); budgets are shares of each layer's
experts (at least top_k of them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from glm53.plan.cache.compare import parse_budgets
from glm53.plan.cache.targets import PolicyRate, evaluate_trace
from glm53.plan.routing.traces import read_trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--budgets", default="0.25,0.375,0.5")
    parser.add_argument("--learn-fraction", type=float, default=0.2)
    args = parser.parse_args()
    console = Console(width=150)
    table = Table(title="Real routing: held-out hit rate (%), each engine's recommended setting vs plain LRU")
    columns = ("trace", "budget", "LRU", "recipe", "vllm", "exllamav3 default", "exllamav3", "proposed", "exl3-cache")
    for column in (*columns, "MIN"):
        table.add_column(column, justify="left" if column == "trace" else "right")
    for path in args.traces:
        trace = read_trace(path)
        learn = max(2, round(trace.steps * args.learn_fraction))
        rows = evaluate_trace(trace, learn, name=path.name, fractions=parse_budgets(args.budgets))
        for row in rows:
            slots = max(trace.top_k, round(row.fraction * trace.experts))

            def cell(engine: str, rates: list[PolicyRate], lru: float = row.lru) -> str:
                found = [r for r in rates if r.engine == engine]
                if not found:
                    return "-"
                return f"{100 * found[0].hit_rate:.2f} ({100 * (found[0].hit_rate - lru):+.2f})"

            default = [r for r in row.baselines if r.engine == "exllamav3"]
            table.add_row(
                f"{path.name} ({len(trace.layers)} layers, {trace.steps:,} steps, "
                f"top-{trace.top_k} of {trace.experts})",
                f"{slots}/{trace.experts}",
                f"{100 * row.lru:.2f}",
                f"{100 * row.recipe:.2f} ({100 * (row.recipe - row.lru):+.2f})",
                cell("vllm", row.recommended),
                cell("exllamav3", default),
                cell("exllamav3", row.recommended),
                cell("proposed", row.recommended),
                cell("exl3-cache", row.recommended),
                f"{100 * row.belady:.2f}",
            )
        for row in rows[:1]:
            labels = ", ".join(f"{r.engine}: {r.label}" for r in row.recommended)
            console.print(f"{path.name} at {row.fraction:.0%}: {labels}", style="dim")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
