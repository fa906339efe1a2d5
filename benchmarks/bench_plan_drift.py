"""The drift-hedged plan against the recipe's own policy: stationary and with popularity shifted.

Two synthetic traces of GLM-5.3-Flash's shape (42 MoE layers x 288 experts, top-8, 20,000 decode steps), plans
learned on the first 20%, scored on the rest at budgets of 8%, 17% and 33% of all experts:

    stationary   locality 0.3                                  target: planned >= recipe + 4 points at 17%
    shifted      locality 0.5, popularity fully re-permuted    target: planned >= recipe - 1 point at
                 per layer at mid-trace                                8%, 17% and 33%
    stretch      planned within 6 points of Belady MIN at 17% on the stationary trace

The stationary run also replays `plan simulate`'s default drift scenarios (re-permuted at 50% and at 15%, inside
the learning window; half the experts re-permuted at 50%) and prints the worst of them per budget.

    python benchmarks/bench_plan_drift.py [--seed N] [--steps N]

The same from the command line: `glm53 plan trace synth --out s.jsonl && glm53 plan simulate s.jsonl`;
`glm53 plan trace synth --out d.jsonl --locality 0.5 --shift 0.5:1 && glm53 plan simulate d.jsonl`.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from glm53.plan.cache.compare import compare_policies
from glm53.plan.cache.render import render_comparison
from glm53.plan.routing.traces import SyntheticTraceSpec, synthesize_trace

DEFAULT_DRIFT = ((0.5, 1.0), (0.15, 1.0), (0.5, 0.5))
BUDGETS = (0.08, 0.17, 0.33)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    console = Console(width=120)
    ok = True

    stationary = synthesize_trace(SyntheticTraceSpec(steps=args.steps, locality=0.3, seed=args.seed))
    report = compare_policies(
        stationary, BUDGETS, source=f"stationary, locality 0.3, seed {args.seed}", drift=DEFAULT_DRIFT
    )
    render_comparison(report, console)
    at_17 = next(b for b in report.budgets if b.fraction == 0.17)
    met = at_17.planned_gain_over_recipe >= 0.04
    ok &= met
    console.print(
        f"target: stationary, planned - recipe >= +4 points at 17%: {at_17.planned_gain_over_recipe * 100:+.2f} "
        f"-> {'met' if met else 'MISSED'}"
    )
    console.print(
        f"stretch: within 6 points of Belady MIN at 17%: {at_17.planned_gap_to_min * 100:.2f} -> "
        f"{'met' if at_17.planned_gap_to_min <= 0.06 else 'not met'}"
    )

    shifted = synthesize_trace(SyntheticTraceSpec(steps=args.steps, locality=0.5, seed=args.seed, shifts=((0.5, 1.0),)))
    report = compare_policies(shifted, BUDGETS, source=f"locality 0.5, re-permuted at 50%, seed {args.seed}")
    render_comparison(report, console)
    for budget in report.budgets:
        met = budget.planned_gain_over_recipe >= -0.01
        ok &= met
        console.print(
            f"target: re-permuted at mid-trace, planned - recipe >= -1 point at {budget.fraction:.0%}: "
            f"{budget.planned_gain_over_recipe * 100:+.2f} -> {'met' if met else 'MISSED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
