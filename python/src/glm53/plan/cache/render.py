"""Rich tables for the cache simulation: recommendations, policy comparisons and the bandwidth probe that feeds
the cost model (human output; `--json` prints the models instead)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from glm53.host.probe import ProbeReport
from glm53.plan.cache.compare import ComparisonReport
from glm53.plan.cache.recommend import Recommendation


def render_recommendation(recommendation: Recommendation, console: Console) -> None:
    """Each engine's recommended setting and its hit rate against plain LRU on every scenario."""
    table = Table(
        title=f"Recommended at {recommendation.slots} GPU experts a layer (vs plain LRU: hit rate in points, "
        "ExLlamaV3's decode rate in %, LRU priced alike; "
        f"learned on {recommendation.learn_steps:,} of {recommendation.steps:,} steps, "
        f"{len(recommendation.layers_replayed)} layers replayed)",
        title_justify="left",
    )
    table.add_column("engine")
    table.add_column("setting")
    for scenario in recommendation.scenarios:
        table.add_column(scenario, justify="right")
    for choice in recommendation.engines:
        name = choice.engine if choice.engine != "proposed" else "proposed (no engine yet)"
        unit = "%" if choice.measure == "decode rate" else ""
        table.add_row(name, choice.label, *(f"{100 * score.gain:+.2f}{unit}" for score in choice.scores))
        if choice.stock_scores:
            stock = (f"{100 * score.gain:+.2f}{unit}" for score in choice.stock_scores)
            table.add_row("", "its defaults (the stock engine)", *stock)
    console.print(table)
    for choice in recommendation.engines:
        if choice.needs:
            console.print(f"proposed: {choice.label}; {choice.needs}")


def render_engine_policies(report: ComparisonReport, console: Console) -> None:
    """The engines' own policies: defaults and recommendations, hit rate and decode rate as each engine pays."""
    if not report.engines:
        return
    table = Table(
        title="The engines' own policies, held-out hit rate (recommended on the learned part)", title_justify="left"
    )
    for column in ("budget", "engine", "setting", "hit rate", "vs LRU", "tok/s"):
        table.add_column(column, justify="left" if column in ("engine", "setting") else "right")
    for row in report.engines:
        policies = [*row.baselines, *row.recommended]
        for index, policy in enumerate(policies):
            recommended = index >= len(row.baselines)
            engine = policy.engine if policy.engine != "proposed" else "proposed (no engine yet)"
            table.add_row(
                f"{row.fraction:.0%}" if index == 0 else "",
                engine + (": recommended" if recommended and policy.engine != "proposed" else ""),
                policy.label,
                f"{policy.hit_rate:.2%}",
                f"{(policy.hit_rate - row.lru) * 100:+.2f} pt",
                "-" if policy.tokens_per_s is None else f"{policy.tokens_per_s:.1f}",
            )
        table.add_row(
            "",
            "",
            "Belady MIN (same slots)",
            f"{row.belady:.2%}",
            f"{(row.belady - row.lru) * 100:+.2f} pt",
            "-",
            end_section=True,
        )
    console.print(table)
    for note in report.engine_costs:
        console.print(f"cost: {note}")


def render_comparison(report: ComparisonReport, console: Console) -> None:
    console.print(
        f"trace {report.trace or '(synthetic)'}: {report.layers} layers x {report.experts} experts x "
        f"top-{report.top_k} x {report.steps:,} steps; learned on the first {report.learned_steps:,}, "
        f"scored on the other {report.scored_steps:,}"
    )
    table = Table(title="Expert-cache policies, held-out hit rate", title_justify="left")
    table.add_column("budget", justify="right")
    table.add_column("policy")
    table.add_column("hit rate", justify="right")
    table.add_column("vs (b)", justify="right")
    table.add_column("PCIe MB/token", justify="right")
    table.add_column("pred. tok/s", justify="right")
    for budget in report.budgets:
        base = budget.result("b").hit_rate
        for index, result in enumerate(budget.results):
            table.add_row(
                f"{budget.fraction:.0%} ({budget.slots:,})" if index == 0 else "",
                f"({result.policy}) {result.label}",
                f"{result.hit_rate:.2%}",
                "" if result.policy == "b" else f"{(result.hit_rate - base) * 100:+.2f} pt",
                "-" if result.pcie_bytes_per_token is None else f"{result.pcie_bytes_per_token / 1e6:,.0f}",
                "-" if result.tokens_per_s is None else f"{result.tokens_per_s:.1f}",
                end_section=index == len(budget.results) - 1,
            )
    console.print(table)
    for budget in report.budgets:
        console.print(
            f"{budget.fraction:.0%}: planned (c) beats recipe (b) by "
            f"{budget.planned_gain_over_recipe * 100:.2f} "
            f"points; Belady MIN (d) is {budget.planned_gap_to_min * 100:.2f} points above (c)"
        )
    if report.drift_scenarios:
        table = Table(
            title="Drift: planned (c) minus recipe (b), points, each scenario re-learned on its own first part",
            title_justify="left",
        )
        table.add_column("budget", justify="right")
        table.add_column("stationary", justify="right")
        for at, strength in report.drift_scenarios:
            table.add_column(f"shift {strength:.0%} at {at:.0%}", justify="right")
        table.add_column("worst", justify="right")
        for budget in report.budgets:
            worst = budget.worst_drift_gain
            table.add_row(
                f"{budget.fraction:.0%}",
                f"{budget.planned_gain_over_recipe * 100:+.2f}",
                *(f"{d.gain * 100:+.2f}" for d in budget.drift),
                "-" if worst is None else f"{worst * 100:+.2f}",
            )
        console.print(table)
    if report.cost_model is not None:
        console.print(
            f"cost model: host->device {report.cost_model.host_to_device.source}; GPU {report.cost_model.gpu_note}"
        )
    console.print(
        f"time: learning {report.learn_seconds:.1f} s, planning + simulations {report.total_seconds:.1f} s "
        f"wall, {report.cpu_seconds:.1f} s CPU over {report.workers} process(es)"
    )
    render_engine_policies(report, console)


def render_probe(report: ProbeReport, block_bytes: int, seconds: float, console: Console) -> None:
    table = Table(title=f"host->device, {block_bytes:,}-B blocks, {report.device}", title_justify="left")
    for column in ("memory", "GB/s", "ms per block"):
        table.add_column(column, justify="right")
    for result in report.results:
        table.add_row(result.kind, f"{result.bytes_per_s / 1e9:.2f}", f"{result.seconds / result.repeats * 1e3:.3f}")
    console.print(table)
    console.print(f"torch {report.torch}, CUDA {report.cuda}; {seconds:.1f} s")
