"""The vLLM pool plan as tables: GPU and host ledgers, the cache split by layer, KV and the CPU sets (human
output; `--json` prints the plan instead)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from glm53.constants import format_gib
from glm53.host.topology import format_cpu_list
from glm53.plan.cache.render import render_recommendation
from glm53.plan.cache.slots import LayerCache
from glm53.plan.vllm.planner import Plan


def render_plan(plan: Plan, console: Console, env: dict[str, str] | None = None) -> None:
    """The vLLM plan: its shape, then each ledger and the cache in turn, then --env's lines."""
    shape = plan.shape
    console.print(f"[bold]Plan[/bold] for {plan.model} ({plan.model_source})")
    console.print(
        f"TP {shape.tensor_parallel_size}, context {shape.max_model_len:,}, "
        f"{shape.max_num_seqs} sequence(s), {shape.max_num_batched_tokens:,} batched tokens, "
        f"GPU memory utilization {shape.gpu_memory_utilization}"
    )
    _render_gpu_ledger(plan, console)
    _render_kv(plan, console)
    _render_host(plan, console)
    _render_cpu_sets(plan, console)
    _render_cache(plan, console)
    if env is not None:
        table = Table(title="Environment (--env)", title_justify="left")
        table.add_column("key")
        table.add_column("value", overflow="fold")
        for key, value in env.items():
            table.add_row(key, value)
        console.print(table)


def _render_gpu_ledger(plan: Plan, console: Console) -> None:
    """The GPU memory ledger, per GPU."""
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
        gpus.add_row(label, *(format_gib(v) for v in values))
    gpus.add_row("slots x bytes", *(f"{g.expert_slots:,} x {g.expert_slot_bytes:,} B" for g in plan.gpus))
    gpus.add_row("staging slots", *(f"{g.staging_slots:,}" for g in plan.gpus))
    console.print(gpus)


def _render_kv(plan: Plan, console: Console) -> None:
    """The KV cache's derivation, per GPU, beside the recipe's figures."""
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


def _render_host(plan: Plan, console: Console) -> None:
    """The host memory ledger."""
    host = plan.host
    table = Table(title="Host memory ledger", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("note")
    table.add_row("MemTotal", format_gib(host.mem_total_bytes), "")
    table.add_row("budget", format_gib(host.budget_bytes), host.budget_source)
    table.add_row(
        "pinned expert pool",
        format_gib(host.pinned_pool_bytes),
        f"every rank's shard of every routed expert; CPU_OFFLOAD_GB={host.cpu_offload_gb} per GPU",
    )
    table.add_row("serving overhead", format_gib(host.serving_overhead_bytes), "processes, CUDA host allocations")
    table.add_row("page cache (reclaimable)", format_gib(host.page_cache_bytes), "what the budget leaves")
    table.add_row("outside the budget", format_gib(host.outside_budget_bytes), "reserve for the system")
    console.print(table)


def _render_cpu_sets(plan: Plan, console: Console) -> None:
    """The CPU sets of the serving process and the expert pools."""
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


def _render_cache(plan: Plan, console: Console) -> None:
    """The GPU expert cache per layer run, its hit rate, the prediction and the warnings."""
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
