"""The decode-rate model against the recipe's published figures (47.9-50.4 tok/s at 8K-260K on 2x RTX 3090).

The recipe's policy (uniform slots, the hottest 20% pinned, rankings learned on the first 20%) is replayed at
the recipe's budget, 3,106 expert slots a GPU (`glm53 plan --rig recipe-2x3090`: 74 or 73 a layer), over a
synthetic GLM-5.3-shaped trace (the real model's routing is not public); each held-out step is priced by
`glm53.plan.cache.engine_cost` for every miss path, at the three published contexts. Then the same at fixed hit
rates, since the real traffic's hit rate is what the trace can only stand in for.

    python benchmarks/bench_cost_recipe.py [--steps 20000] [--seed 0] [--locality 0.3]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

from glm53.plan.cache.allocation import uniform_split
from glm53.plan.cache.engine_cost import MISS_PATHS, PUBLISHED_RANGE, compare_with_recipe
from glm53.plan.cache.policies import pinned_lru_step_hits
from glm53.plan.inputs.kv import derive_kv
from glm53.plan.inputs.model import load_architecture
from glm53.plan.routing.traces import SyntheticTraceSpec, rank_experts, synthesize_trace

RECIPE_SLOTS = 3106  # per GPU at TP 2 (docs/plan.md, the GPU ledger of the recipe's rig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--locality", type=float, default=0.3)
    args = parser.parse_args()
    console = Console(width=130)
    model = load_architecture()
    kv = derive_kv(model, 2)
    trace = synthesize_trace(SyntheticTraceSpec(steps=args.steps, seed=args.seed, locality=args.locality))
    cut = trace.steps // 5
    slots = uniform_split(RECIPE_SLOTS, len(trace.layers), trace.experts)
    pinned = [round(0.2 * s) for s in slots]
    rankings = np.stack([rank_experts(row) for row in trace.slice(0, cut).counts()])
    hits = pinned_lru_step_hits(
        trace.routes, trace.experts, rankings, pinned, [s - p for s, p in zip(slots, pinned, strict=True)]
    )
    report = compare_with_recipe(
        model,
        kv,
        hits.hits[cut:],
        hit_rate_source=(
            f"synthetic trace, locality {args.locality}, seed {args.seed}, held-out {trace.steps - cut:,} steps"
        ),
        slots_per_layer=max(slots),
        pinned_per_layer=max(pinned),
    )
    table = Table(title=f"Decode tok/s: published vs predicted (recipe's policy, hit rate {report.hit_rate:.1%})")
    table.add_column("context", justify="right")
    table.add_column("published", justify="right")
    table.add_column("today's model", justify="right")
    for path in MISS_PATHS:
        table.add_column(path, justify="right")
    for row in report.rows:
        cells = [f"{row.context_tokens:,}", f"{row.published:.1f}", f"{row.today:.1f}"]
        for path in MISS_PATHS:
            value = row.predicted[path]
            cells.append(f"{value:.1f} ({(value - row.published) / row.published:+.0%})")
        table.add_row(*cells)
    console.print(table)
    sensitivity = Table(title="At a fixed hit rate, context 8,192 (tok/s)")
    sensitivity.add_column("hit rate", justify="right")
    for path in MISS_PATHS:
        sensitivity.add_column(path, justify="right")
    for rate, values in report.sensitivity.items():
        sensitivity.add_row(rate, *[f"{values[path]:.1f}" for path in MISS_PATHS])
    console.print(sensitivity)
    console.print(
        f"hit rate: {report.hit_rate_source}; {report.slots_per_layer} slots a layer, {report.pinned_per_layer} pinned"
    )
    for line in report.assumptions:
        console.print(f"assumed: {line}")
    best = report.rows[0].predicted["cpu+pcie"]
    low, high = PUBLISHED_RANGE
    console.print(f"cpu+pcie at 8K: {best:.1f} tok/s against {low}-{high} published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
