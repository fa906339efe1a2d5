"""The ExLlamaV3 plans as tables: the layer split with its CPU experts, and the GPU expert cache (human output;
`--json` prints the plans instead)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from glm53.constants import format_gib
from glm53.host.topology import format_cpu_list
from glm53.plan.cache.render import render_recommendation
from glm53.plan.exllamav3.expert_cache import CacheCheck, ExpertCachePlan
from glm53.plan.exllamav3.split import Exl3Plan


def _layer_runs(layers: list[int]) -> str:
    """Layer ids as runs: 0-23, or 0-3,7."""
    return format_cpu_list(layers) or "-"


def render_exl3_plan(plan: Exl3Plan, console: Console) -> None:
    """The ExLlamaV3 plan: per-GPU ledger, host ledger, offload decision, predicted rate, the expert cache,
    warnings, env."""
    _render_gpu_ledger(plan, console)
    _render_host_ledger(plan, console)
    _render_decision(plan, console)
    if plan.expert_cache is not None:
        _render_cache_plan(plan, console)
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


def _render_gpu_ledger(plan: Exl3Plan, console: Console) -> None:
    """The shape, then what each GPU holds, in layer order."""
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
        gpus.add_row(label, *(format_gib(v) for v in values))
    gpus.add_row("routed experts resident", *(f"{g.resident_experts:,}" for g in plan.gpus))
    console.print(gpus)


def _render_host_ledger(plan: Exl3Plan, console: Console) -> None:
    """What the host's RAM holds."""
    host = plan.host
    table = Table(title="Host memory ledger", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("note")
    table.add_row("budget", format_gib(host.budget_bytes), host.budget_source)
    table.add_row("experts on the CPU", format_gib(host.cpu_expert_bytes), f"{host.cpu_experts:,} routed experts")
    table.add_row("CPU worker", format_gib(host.worker_overhead_bytes), "job ring, scratch, interpreter")
    table.add_row("server", format_gib(host.server_overhead_bytes), "TabbyAPI, torch, CUDA host allocations")
    table.add_row("free", format_gib(host.free_bytes), "")
    console.print(table)


def _render_decision(plan: Exl3Plan, console: Console) -> None:
    """The offload, the predicted decode rate and, with a trace, the placement and its recommendation."""
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


def _render_cache_plan(plan: Exl3Plan, console: Console) -> None:
    """The expert cache's slots, its predicted decode beside the split's, and its pinned share."""
    size = plan.expert_cache
    assert size is not None
    console.print(
        f"[bold]expert cache:[/bold] {size.slots} resident slots a MoE layer ({size.pinned} pinned + "
        f"{size.window} LRU) and {size.staging} staging, {format_gib(size.used_bytes_per_gpu)} of "
        f"{format_gib(size.cache_bytes_per_gpu)} a GPU over {size.layers_per_gpu} layers; host pool "
        f"{format_gib(size.host_pool_bytes)} page-locked (every routed expert once)"
    )
    if plan.cache_prediction is not None:
        cache = plan.cache_prediction
        split = plan.prediction
        verdict = (
            f"the split ({split.mode}, {split.tokens_per_s:g} tok/s) is predicted faster"
            if split.mode != "gpu" and split.tokens_per_s > cache.tokens_per_s
            else "the cache is predicted faster"
            if split.mode != "gpu"
            else "every expert fits the GPUs: the cache gains nothing"
        )
        console.print(
            f"  predicted decode with the cache: {cache.tokens_per_s:g} tok/s at {cache.hit_rate:.1%} hits "
            f"({cache.hit_rate_source}; {cache.link_source}); {verdict}"
        )
    if plan.cache_choice is not None:
        choice = plan.cache_choice
        setting = f"pinned share {choice.pinned_fraction:.0%}" if choice.policy == "lru" else "frequency policy"
        console.print(
            f"  {setting} ({choice.label}): worst stress scenario {choice.worst_gain_over_lru:+.2%} hit rate vs "
            f"plain LRU, {choice.worst_gain_over_recipe:+.2%} vs the recipe's 20% pinned"
        )


def render_expert_cache(plan: ExpertCachePlan, console: Console) -> None:
    size = plan.size
    table = Table(title=f"GPU expert cache for {plan.model} ({size.gpus} GPUs, {size.layers_per_gpu} MoE layers each)")
    table.add_column("per MoE layer")
    table.add_column("slots", justify="right")
    table.add_column("bytes", justify="right")
    for label, count in (("pinned (hottest)", size.pinned), ("LRU window", size.window), ("staging", size.staging)):
        table.add_row(label, f"{count:,}", format_gib(count * size.slot_bytes))
    table.add_row("resident share of the experts", f"{size.fraction:.1%}", "")
    console.print(table)
    console.print(
        f"per GPU: {format_gib(size.used_bytes_per_gpu)} of {format_gib(size.cache_bytes_per_gpu)} given; "
        "host pool (every "
        f"expert once, page-locked): {format_gib(size.host_pool_bytes)}"
    )
    console.print("lookup kernel per layer: " + ", ".join(f"{k}={v}" for k, v in size.engine_args.items()))
    choice = plan.choice
    if choice is None:
        console.print("pinned share: as given (no trace to choose it from)")
        return
    scores = Table(title=f"cache setting chosen on {plan.source}: {choice.label} (held-out hit rates)")
    for column in ("scenario", "chosen", "plain LRU", "recipe (20% pinned)"):
        scores.add_column(column, justify="left" if column == "scenario" else "right")
    for name, hit, lru, recipe in zip(
        choice.scenarios, choice.hit_rates, choice.lru_hit_rates, choice.recipe_hit_rates, strict=True
    ):
        scores.add_row(name, f"{hit:.2%}", f"{lru:.2%}", f"{recipe:.2%}")
    console.print(scores)
    console.print(
        f"worst gain over plain LRU: {choice.worst_gain_over_lru * 100:+.2f} points; over the recipe's 20% pinned: "
        f"{choice.worst_gain_over_recipe * 100:+.2f} points"
    )


def render_cache_check(check: CacheCheck, console: Console) -> None:
    """The engine's hit counts beside the simulator's, a row per layer."""
    kept = f"{check.pinned} pinned + {check.window} LRU" if check.policy == "lru" else f"{check.window} frequency"
    table = Table(title=f"expert cache: {kept} slots, {check.steps} decode steps")
    for column in ("layer", "engine hits", "simulated hits", "engine misses", "overflow"):
        table.add_column(column, justify="right")
    for row in check.layers:
        table.add_row(
            str(row.layer), str(row.engine_hits), str(row.simulated_hits), str(row.engine_misses), str(row.overflow)
        )
    console.print(table)
    hits = sum(row.engine_hits for row in check.layers)
    lookups = check.steps * check.top_k * len(check.layers)
    verdict = "equal on every layer" if check.equal else "DIFFERENT"
    console.print(f"{verdict}: {hits:,} hits of {lookups:,} lookups ({hits / max(1, lookups):.1%})")
