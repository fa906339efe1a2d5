"""Rich tables for plans, simulation reports, synthetic traces and the bandwidth probe that feeds the cost
model (human output; `--json` prints the models instead)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from glm53.constants import GIB
from glm53.host.probe import ProbeReport
from glm53.host.topology import format_cpu_list
from glm53.plan.cache_plan import LayerCache
from glm53.plan.comparison import ComparisonReport
from glm53.plan.exl3 import Exl3Plan
from glm53.plan.expert_cache import CachePlan
from glm53.plan.planner import Plan
from glm53.plan.recommend import Recommendation
from glm53.plan.traces import SyntheticTraceSpec


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def _layer_runs(layers: list[int]) -> str:
    """Layer ids as runs: 0-23, or 0-3,7."""
    return format_cpu_list(layers) or "-"


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


def render_exl3_plan(plan: Exl3Plan, console: Console) -> None:
    """The ExLlamaV3 plan: per-GPU ledger, host ledger, offload decision, predicted rate, warnings, env."""
    shape = plan.shape
    console.print(f"[bold]ExLlamaV3 plan[/bold] for {plan.model} ({plan.model_source})")
    console.print(
        f"layer split over {shape.gpus} GPU(s), context {shape.max_model_len:,}, {shape.max_num_seqs} "
        f"sequence(s), cache {plan.cache_size:,} tokens x {plan.kv_bytes_per_token:,} B "
        f"(CACHE_MODE {shape.cache_bits[0]},{shape.cache_bits[1]} bits), chunk {shape.chunk_size:,}"
    )
    gpus = Table(title="GPU ledger (layer split, in layer order)", title_justify="left")
    gpus.add_column("item")
    for gpu in plan.gpus:
        gpus.add_column(f"GPU {gpu.index} {gpu.name}", justify="right")
    gpus.add_row("layers", *(_layer_runs(g.layers) for g in plan.gpus))
    rows = [
        ("total", [g.total_bytes for g in plan.gpus]),
        ("used by others", [g.used_by_others_bytes for g in plan.gpus]),
        ("CUDA context (outside torch)", [g.cuda_context_bytes for g in plan.gpus]),
        ("headroom", [g.headroom_bytes for g in plan.gpus]),
        ("GPU_SPLIT (torch's cap)", [g.gpu_split_bytes for g in plan.gpus]),
        ("allocator slack", [g.allocator_slack_bytes for g in plan.gpus]),
        ("budget", [g.budget_bytes for g in plan.gpus]),
        ("non-expert weights", [g.non_expert_bytes for g in plan.gpus]),
        ("experts resident", [g.expert_bytes for g in plan.gpus]),
        ("KV cache (DSA layers)", [g.kv_cache_bytes for g in plan.gpus]),
        ("recurrent state (KDA layers)", [g.recurrent_state_bytes for g in plan.gpus]),
        ("scratch (one chunk)", [g.scratch_bytes for g in plan.gpus]),
        ("free", [g.free_bytes for g in plan.gpus]),
    ]
    for label, values in rows:
        gpus.add_row(label, *(_gib(v) for v in values))
    gpus.add_row("routed experts resident", *(f"{g.resident_experts:,}" for g in plan.gpus))
    console.print(gpus)

    host = plan.host
    table = Table(title="Host memory ledger", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("note")
    table.add_row("budget", _gib(host.budget_bytes), host.budget_source)
    table.add_row("experts on the CPU", _gib(host.cpu_expert_bytes), f"{host.cpu_experts:,} routed experts")
    table.add_row("CPU worker", _gib(host.worker_overhead_bytes), "job ring, scratch, interpreter")
    table.add_row("server", _gib(host.server_overhead_bytes), "TabbyAPI, torch, CUDA host allocations")
    table.add_row("free", _gib(host.free_bytes), "")
    console.print(table)

    offload = plan.offload
    console.print(f"[bold]offload:[/bold] {offload.mode}: {offload.reason}")
    prediction = plan.prediction
    line = (
        f"[bold]predicted decode:[/bold] {prediction.tokens_per_s:g} tok/s ({prediction.mode}; "
        f"{prediction.cpu_share:.1%} of selections on the CPU, {prediction.cpu_share_source})"
    )
    others = "; ".join(f"{p.mode} {p.tokens_per_s:g} tok/s" for p in plan.alternatives)
    console.print(line + (f"; the alternative: {others}" if others else ""))
    if plan.placement is not None:
        placement = plan.placement
        console.print(
            f"[bold]placement[/bold] ({placement.split_experts} experts a layer on the CPU, scored on "
            f"{placement.scored_steps:,} steps): static {placement.static_cpu_share:.1%}, dynamic "
            f"{placement.dynamic_cpu_share:.1%} ({placement.swaps:,} swaps), uniform "
            f"{placement.uniform_cpu_share:.1%}: {placement.verdict}"
        )
    if plan.recommendation is not None:
        render_recommendation(plan.recommendation, console)
    console.print(
        f"CPU worker: {plan.threads} thread(s) on {format_cpu_list(plan.cpu_pool) or '-'}; "
        f"server on {format_cpu_list(plan.main_cpus) or '-'}"
    )
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    table = Table(title="Environment (glm53 serve --plan-env)", title_justify="left")
    table.add_column("key")
    table.add_column("value")
    table.add_column("why")
    for key, value in plan.env.items():
        table.add_row(key, value, plan.origins.get(key, ""))
    console.print(table)


def render_plan(plan: Plan, console: Console, env: dict[str, str] | None = None) -> None:
    shape = plan.shape
    console.print(f"[bold]Plan[/bold] for {plan.model} ({plan.model_source})")
    console.print(
        f"TP {shape.tensor_parallel_size}, context {shape.max_model_len:,}, "
        f"{shape.max_num_seqs} sequence(s), {shape.max_num_batched_tokens:,} batched tokens, "
        f"GPU memory utilization {shape.gpu_memory_utilization}"
    )

    gpus = Table(title="GPU memory ledger (per GPU)", title_justify="left")
    gpus.add_column("item")
    for gpu in plan.gpus:
        label = f"GPU {gpu.index}" if gpu.name == "GPU" else f"GPU {gpu.index} {gpu.name}"
        gpus.add_column(label, justify="right")
    rows = [
        ("total", [g.total_bytes for g in plan.gpus]),
        ("budget (utilization x total)", [g.budget_bytes for g in plan.gpus]),
        ("weights (non-expert, this rank)", [g.weights_bytes for g in plan.gpus]),
        ("KV cache", [g.kv_bytes for g in plan.gpus]),
        ("workspace", [g.workspace_bytes for g in plan.gpus]),
        ("headroom", [g.headroom_bytes for g in plan.gpus]),
        ("expert slots", [g.expert_cache_bytes for g in plan.gpus]),
        ("expert staging (one step's misses)", [g.staging_bytes for g in plan.gpus]),
        ("left over (< 1 slot)", [g.unused_bytes for g in plan.gpus]),
    ]
    for label, values in rows:
        gpus.add_row(label, *(_gib(v) for v in values))
    gpus.add_row("slots x bytes", *(f"{g.expert_slots:,} x {g.expert_slot_bytes:,} B" for g in plan.gpus))
    gpus.add_row("staging slots", *(f"{g.staging_slots:,}" for g in plan.gpus))
    console.print(gpus)

    kv = plan.kv
    d = kv.derivation
    table = Table(title="KV cache derivation (per GPU)", title_justify="left")
    table.add_column("term")
    table.add_column("bytes", justify="right")
    table.add_row(
        f"MLA latent: {d.dsa_layers} DSA layers x {d.latent_bytes_per_layer} B",
        f"{d.dsa_layers * d.latent_bytes_per_layer:,} / token",
    )
    table.add_row(
        f"indexer keys: {d.dsa_layers} x {d.indexer_key_bytes_per_layer} B (fp8 + scale)",
        f"{d.dsa_layers * d.indexer_key_bytes_per_layer:,} / token",
    )
    table.add_row(
        f"KDA state: {d.kda_layers} layers x {d.kda_state_bytes_per_layer:,} B / TP"
        + (" (dimensions assumed)" if d.kda_state_assumed else ""),
        f"{d.kda_state_bytes_per_sequence:,} / sequence",
    )
    table.add_row(f"KV_CACHE_MEMORY_BYTES ({kv.kv_source})", f"{kv.kv_cache_memory_bytes:,}")
    table.add_row("tokens it holds (derived)", f"{kv.tokens:,}")
    cmp = kv.recipe_comparison
    table.add_row(f"recipe: {cmp.kv_cache_memory_bytes:,} B, reported", f"{cmp.reported_tokens:,} tokens")
    table.add_row("recipe: derived for the same bytes", f"{cmp.derived_tokens:,} tokens ({-cmp.gap_fraction:+.1%})")
    console.print(table)

    host = plan.host
    table = Table(title="Host memory ledger", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("note")
    table.add_row("MemTotal", _gib(host.mem_total_bytes), "")
    table.add_row("budget", _gib(host.budget_bytes), host.budget_source)
    table.add_row(
        "pinned expert pool",
        _gib(host.pinned_pool_bytes),
        f"every rank's shard of every routed expert; CPU_OFFLOAD_GB={host.cpu_offload_gb} per GPU",
    )
    table.add_row("serving overhead", _gib(host.serving_overhead_bytes), "processes, CUDA host allocations")
    table.add_row("page cache (reclaimable)", _gib(host.page_cache_bytes), "what the budget leaves")
    table.add_row("outside the budget", _gib(host.outside_budget_bytes), "reserve for the system")
    console.print(table)

    cpus = plan.cpu_sets
    table = Table(title="CPU sets", title_justify="left")
    table.add_column("set")
    table.add_column("CPUs")
    table.add_row("serving process (HYBRID_MAIN_CPUS)", cpus.main_text)
    for rank, pool in enumerate(cpus.pools):
        table.add_row(f"expert pool, rank {rank}", format_cpu_list(pool) or "(none)")
    table.add_row("threads per rank (OMP_NUM_THREADS)", str(cpus.threads_per_rank))
    table.add_row(
        "topology",
        f"{cpus.l3_domains} L3 domain(s), {cpus.numa_nodes} NUMA node(s) with allowed CPUs, "
        + ("SMT" if cpus.smt else "no SMT"),
    )
    table.add_row("NUMA placement", cpus.placement or "-")
    console.print(table)

    cache = plan.cache
    table = Table(title=f"GPU expert cache: {cache.strategy} ({cache.source or 'no statistics'})", title_justify="left")
    for column in ("layers", "slots", "pinned", "LRU window", "hit rate"):
        table.add_column(column, justify="right")
    for first, last, layer in _runs(cache.layers):
        rate = layer.scored_hit_rate if layer.scored_hit_rate is not None else layer.learned_hit_rate
        table.add_row(
            str(first) if first == last else f"{first}-{last}",
            str(layer.slots),
            str(layer.pinned),
            str(layer.window),
            "-" if rate is None else f"{rate:.1%}",
        )
    console.print(table)
    hit = cache.expected_hit_rate
    console.print(
        f"{cache.total_slots:,} slots over {len(cache.layers)} layers; "
        f"pinned share {cache.pinned_fraction:.1%}; expected hit rate "
        + ("unknown (no routing statistics)" if hit is None else f"{hit:.1%} ({cache.hit_rate_basis})")
    )
    if cache.hedge_weight is not None and cache.drift_case_hit_rate is not None:
        console.print(
            f"drift hedge: weight {cache.hedge_weight:.2f} on the re-permuted case; learned hit rate "
            f"{_rate(cache.layers)} (unhedged {cache.learned_hit_rate_unhedged or 0:.1%}); if popularity "
            f"were fully re-permuted: {cache.drift_case_hit_rate:.1%} vs the recipe's "
            f"{cache.recipe_drift_case_hit_rate or 0:.1%}"
        )
    if cache.recommendation is not None:
        render_recommendation(cache.recommendation, console)
    if plan.predicted_tokens_per_s is not None:
        console.print(
            f"predicted decode: {plan.predicted_tokens_per_s:.1f} tok/s "
            f"(host->device {plan.cost.host_to_device.source}; GPU {plan.cost.gpu_note})"
        )
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    if env is not None:
        table = Table(title="Environment (--env)", title_justify="left")
        table.add_column("key")
        table.add_column("value", overflow="fold")
        for key, value in env.items():
            table.add_row(key, value)
        console.print(table)


def _rate(layers: list[LayerCache]) -> str:
    rates = [layer.learned_hit_rate for layer in layers if layer.learned_hit_rate is not None]
    return f"{sum(rates) / len(rates):.1%}" if rates else "-"


def _runs(layers: list[LayerCache]) -> list[tuple[int, int, LayerCache]]:
    """Consecutive layers with the same slots/pinned/window (and no per-layer score) collapse into one row."""
    out: list[tuple[int, int, LayerCache]] = []
    for layer in layers:
        if out:
            first, last, prev = out[-1]
            if (
                (prev.slots, prev.pinned, prev.window) == (layer.slots, layer.pinned, layer.window)
                and layer.layer == last + 1
                and layer.scored_hit_rate is None
                and prev.scored_hit_rate is None
            ):
                out[-1] = (first, layer.layer, prev)
                continue
        out.append((layer.layer, layer.layer, layer))
    return out


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


def render_synthetic_trace(path: Path, spec: SyntheticTraceSpec, console: Console) -> None:
    console.print(
        f"wrote {path}: {spec.steps:,} steps x {len(spec.layers)} layers x top-{spec.top_k} of {spec.experts}"
    )


def render_probe(report: ProbeReport, block_bytes: int, seconds: float, console: Console) -> None:
    table = Table(title=f"host->device, {block_bytes:,}-B blocks, {report.device}", title_justify="left")
    for column in ("memory", "GB/s", "ms per block"):
        table.add_column(column, justify="right")
    for result in report.results:
        table.add_row(result.kind, f"{result.bytes_per_s / 1e9:.2f}", f"{result.seconds / result.repeats * 1e3:.3f}")
    console.print(table)
    console.print(f"torch {report.torch}, CUDA {report.cuda}; {seconds:.1f} s")


def render_expert_cache(plan: CachePlan, console: Console) -> None:
    size = plan.size
    table = Table(title=f"GPU expert cache for {plan.model} ({size.gpus} GPUs, {size.layers_per_gpu} MoE layers each)")
    table.add_column("per MoE layer")
    table.add_column("slots", justify="right")
    table.add_column("bytes", justify="right")
    for label, count in (("pinned (hottest)", size.pinned), ("LRU window", size.window), ("staging", size.staging)):
        table.add_row(label, f"{count:,}", _gib(count * size.slot_bytes))
    table.add_row("resident share of the experts", f"{size.fraction:.1%}", "")
    console.print(table)
    console.print(
        f"per GPU: {_gib(size.used_bytes_per_gpu)} of {_gib(size.cache_bytes_per_gpu)} given; host pool (every "
        f"expert once, page-locked): {_gib(size.host_pool_bytes)}"
    )
    console.print("lookup kernel per layer: " + ", ".join(f"{k}={v}" for k, v in size.engine_args.items()))
    choice = plan.choice
    if choice is None:
        console.print("pinned share: as given (no trace to choose it from)")
        return
    scores = Table(title=f"pinned share chosen on {plan.source}: {choice.label} (held-out hit rates)")
    for column in ("scenario", "chosen", "plain LRU", "recipe (20% pinned)"):
        scores.add_column(column, justify="left" if column == "scenario" else "right")
    for name, hit, lru, recipe in zip(
        choice.scenarios, choice.hit_rates, choice.lru_hit_rates, choice.recipe_hit_rates, strict=True
    ):
        scores.add_row(name, f"{hit:.2%}", f"{lru:.2%}", f"{recipe:.2%}")
    console.print(scores)
    console.print(f"worst gain over plain LRU: {choice.worst_gain_over_lru * 100:+.2f} points")


__all__ = ["render_comparison", "render_expert_cache", "render_plan", "render_probe", "render_synthetic_trace"]
