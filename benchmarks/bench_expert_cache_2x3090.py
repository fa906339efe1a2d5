"""The GPU expert cache on the recipe's 2x RTX 3090 rig, predicted from what one GPU measured.

Inputs, each printed with its source:
- the cache's per-step cost, from `benchmarks/data/expert-cache-h100.json` (tools/exl3-expert-cache-bench.py on
  one H100, GLM-5.3-Flash's expert dimensions, ExLlamaV3 1.4.6's kernels; `--measured` takes another run, such as
  the earlier H200 one): with the fetch paced to a PCIe 4.0 x16 link (25 GB/s), each layer-step took the
  all-resident time + misses x expert bytes / 25 GB/s + a fixed overhead (lookup, stream fork and join), fitted
  here over every paced exact run (LRU, pinned LRU, decayed frequency, streaming); the fit's worst error is shown;
- the CPU's cost, from the same run's split and hybrid modes (ExLlamaV3's own CPU kernel, `exl3_moe_cpu_forward`,
  on that host's CPU at the run's thread count): a layer-step took the all-resident eager time + a fixed hand-off
  (routing to the host and back) + the CPU-computed experts x a cost each, fitted over those runs. The 3090 host's
  own CPU is not measured: these rows assume one like the H100 host's at the same thread count;
- the slots per layer: `glm53 plan expert-cache` at the expert memory ExLlamaV3's planner leaves each 3090
  (`glm53 plan host --profile exl3-2x3090 --rig recipe-2x3090`: 1,848 resident experts' worth a GPU), less the
  staging arena of host-resident experts (one layer's 288 experts a GPU, which prefill reads), as
  `glm53 plan host --expert-cache` sizes it;
- the hit rate: that cache replayed over a synthetic GLM-5.3-shaped trace (the real model's routing is not
  public), plain LRU, the recipe's 20% pinned and a 0.4 share, held-out after the rankings' learning part, and
  the kernel's decayed-frequency policy at half-lives 16, 32, 64, 256 and 1,024 (its lookup timed in the same run:
  its paced runs are in the fit), and the setting `glm53 plan expert-cache` recommends from the learning part (the
  robust choice among those, never below plain LRU on its stress scenarios); the hybrid's hits are the 20% pinned
  cache's, its misses all on the CPU; the static split holds the `slots + staging` hottest experts a layer (by the
  learning part) and computes the rest on the CPU;
- the GPU time per token of the rest: `glm53.plan.cache.decode_cost` (every weight a token reads once at the share of
  the 3090's 936 GB/s EXL3 kernels reach at batch 1, `GPU_KERNEL_EFFICIENCY`; layer split: the two GPUs run
  one after the other, so only one PCIe link works at a time).

    python benchmarks/bench_expert_cache_2x3090.py [--steps 20000] [--seed 0] [--locality 0.3] [--measured JSON]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from glm53.plan.cache.decode_cost import GPU_KERNEL_EFFICIENCY, build_cost_model
from glm53.plan.cache.engine_cost import PUBLISHED_RANGE
from glm53.plan.cache.policies import decayed_frequency, pinned_lru_step_hits
from glm53.plan.cache.recommend import EXPERT_CACHE_HALF_LIVES
from glm53.plan.exllamav3.expert_cache import arena_bytes, choose_cache_setting, size_cache
from glm53.plan.inputs.gpus import ASSUMED_GPU_MEMORY_BANDWIDTH
from glm53.plan.inputs.kv import derive_kv
from glm53.plan.inputs.model import load_architecture
from glm53.plan.routing.traces import SyntheticTraceSpec, rank_experts, synthesize_trace

MEASURED = Path(__file__).parent / "data" / "expert-cache-h100.json"
PCIE4 = 25e9
# `glm53 plan host --profile exl3-2x3090 --rig recipe-2x3090 --json`: gpus[].expert_bytes (1,848 experts a GPU).
EXPERT_BUDGET_PER_3090 = 17_508_062_880
PEERS = {
    "llama.cpp forks with a GPU expert cache, 2x3090 (UD-IQ3_XXS)": "17-22",
    "ExLlamaV3 + patches, one 3090, exact": "12.6",
    "ExLlamaV3 1.4.6 stock split, predicted by `glm53 plan host --profile exl3-2x3090` (its own GPU model)": "18.8",
}


def fitted_overhead(report: dict) -> tuple[float, float, float]:
    """(resident seconds a layer-step, fixed overhead a layer-step, worst relative error of the fit) over the
    paced runs: time = resident + overhead + misses x bytes / 25 GB/s."""
    args, runs = report["args"], report["runs"]
    per = args["steps"] * args["layers"]
    resident = runs["resident/graph"]["seconds"] / per
    paced = [run for label, run in runs.items() if label.endswith("-pcie4") and "kl_gate" not in run]  # exact ones
    moved = [sum(run["misses"]) / per * report["expert_bytes"] / PCIE4 for run in paced]
    measured = [run["seconds"] / per for run in paced]
    overhead = float(np.mean([t - resident - m for t, m in zip(measured, moved, strict=True)]))
    worst = max(abs(resident + overhead + m - t) / t for t, m in zip(measured, moved, strict=True))
    return resident, overhead, worst


def fitted_cpu_cost(report: dict) -> tuple[float, float, float] | None:
    """(fixed hand-off a layer-step, seconds a CPU-computed expert, worst relative error) over the split and
    hybrid runs: time = resident eager + hand-off + experts on the CPU x cost; None for a run without them."""
    args, runs = report["args"], report["runs"]
    per = args["steps"] * args["layers"]
    resident = runs["resident/eager"]["seconds"] / per
    cpu_runs = [run for label, run in runs.items() if "cpu_share" in run]
    if len(cpu_runs) < 2:
        return None
    experts = np.array([run["cpu_share"] * args["top_k"] for run in cpu_runs])
    extra = np.array([run["seconds"] / per - resident for run in cpu_runs])
    cost, fixed = np.polyfit(experts, extra, 1)
    predicted = resident + fixed + cost * experts
    measured = extra + resident
    return float(fixed), float(cost), float(np.max(np.abs(predicted - measured) / measured))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--locality", type=float, default=0.3)
    parser.add_argument("--measured", type=Path, default=MEASURED, help="tools/exl3-expert-cache-bench.py's report")
    args = parser.parse_args()
    console = Console(width=130)
    report = json.loads(args.measured.read_text())
    resident, overhead, worst = fitted_overhead(report)
    cpu = fitted_cpu_cost(report)
    model = load_architecture()
    size = size_cache(model, EXPERT_BUDGET_PER_3090 - arena_bytes(model), gpus=2)  # EXPERT_CACHE_EXPERTS=host
    cost = build_cost_model(
        model,
        derive_kv(model, 1),
        tensor_parallel_size=1,
        gpu_memory_bandwidth=ASSUMED_GPU_MEMORY_BANDWIDTH * GPU_KERNEL_EFFICIENCY,
    )
    trace = synthesize_trace(SyntheticTraceSpec(steps=args.steps, seed=args.seed, locality=args.locality))
    cut = trace.steps // 5
    rankings = np.stack([rank_experts(row) for row in trace.slice(0, cut).counts()])
    layers = len(trace.layers)
    lookups = trace.top_k * layers

    table = Table(title=f"GPU expert cache on 2x RTX 3090: {size.slots} slots a layer + {size.staging} staging")
    for column in ("policy", "held-out hit rate", "GB over PCIe a token", "tok/s predicted"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    policies: list[tuple[str, float | None, float | None]] = [
        ("plain LRU", 0.0, None),
        ("recipe: 20% pinned", 0.2, None),
        ("40% pinned", 0.4, None),
        *((f"decayed frequency, half-life {h:g}", None, h) for h in EXPERT_CACHE_HALF_LIVES),
    ]
    # what the plan would set: its robust choice on the learning part, replayed like the rows above
    choice = choose_cache_setting(trace.slice(0, cut), size, seed=args.seed)
    policies.append(
        (f"recommended: {choice.label}", choice.pinned_fraction if choice.policy == "lru" else None, choice.half_life)
    )
    for label, share, half_life in policies:
        if half_life is None:
            pinned = round((share or 0.0) * size.slots)
            hits = pinned_lru_step_hits(
                trace.routes, trace.experts, rankings, [pinned] * layers, [size.slots - pinned] * layers
            )
        else:
            hits = decayed_frequency(trace.routes, trace.experts, [size.slots], half_life=half_life)
        rate = hits.total(cut) / ((trace.steps - cut) * lookups)
        moved = (1 - rate) * lookups * model.expert_bytes
        seconds = cost.gpu_seconds_per_token + layers * overhead + moved / PCIE4
        table.add_row(label, f"{rate:.1%}", f"{moved / 1e9:.2f}", f"{1 / seconds:.1f}")
        if cpu is not None and label == "recipe: 20% pinned":
            # the same cache, its misses computed on the CPU instead of copied (the hybrid)
            fixed, per_expert, _ = cpu
            seconds = cost.gpu_seconds_per_token + layers * (overhead + fixed) + (1 - rate) * lookups * per_expert
            table.add_row("hybrid: 20% pinned, misses on the CPU", f"{rate:.1%}", "0", f"{1 / seconds:.1f}")
    if cpu is not None:
        fixed, per_expert, _ = cpu
        # the stock split keeps its GPU experts resident: no arena, the whole budget (slots + staging at 0 arena)
        whole = size_cache(model, EXPERT_BUDGET_PER_3090, gpus=2)
        held = whole.slots + whole.staging
        future = trace.routes[cut:]
        on_gpu = sum(np.isin(future[:, i, :], rankings[i][:held]).sum() for i in range(layers)) / future.size
        seconds = cost.gpu_seconds_per_token + layers * fixed + (1 - on_gpu) * lookups * per_expert
        table.add_row(f"static split: {held} hottest on the GPU", f"{on_gpu:.1%} on GPU", "0", f"{1 / seconds:.1f}")
    console.print(table)
    for hit_rate in (0.67, 0.83):
        moved = (1 - hit_rate) * lookups * model.expert_bytes
        seconds = cost.gpu_seconds_per_token + layers * overhead + moved / PCIE4
        console.print(f"at {hit_rate:.0%} hits: {1 / seconds:.1f} tok/s")
    low, high = PUBLISHED_RANGE
    console.print(f"the recipe (vendor vLLM, TP 2, both links at once, CPU tier): {low}-{high} tok/s published")
    for peer, rate_text in PEERS.items():
        console.print(f"peer: {peer}: {rate_text} tok/s")
    console.print(
        f"measured on {report['device']}: resident {resident * 1e3:.3f} ms a layer-step, cache overhead "
        f"{overhead * 1e3:.3f} ms a layer-step (fit's worst error {worst:.1%} over the paced runs); "
        f"copy engine pinned {report['copy']['copy_engine_pinned_gbps']:.1f} GB/s, pageable "
        f"{report['copy']['copy_engine_pageable_gbps']:.1f} GB/s, SM fetch over mapped memory "
        f"{report['copy']['sm_fetch_mapped_gbps']:.1f} GB/s, "
        f"paced {report['copy']['sm_fetch_pcie4_paced_gbps']:.1f} GB/s"
    )
    if cpu is not None:
        fixed, per_expert, cpu_worst = cpu
        console.print(
            f"CPU (ExLlamaV3's CPU kernel, {report['args']['cpu_threads']} threads of the {report['device']} host): "
            f"{per_expert * 1e3:.3f} ms an expert ({report['expert_bytes'] / per_expert / 1e9:.1f} GB/s of "
            f"weights), hand-off {fixed * 1e3:.3f} ms a layer-step (fit's worst error {cpu_worst:.1%})"
        )
    console.print(f"GPU time of the rest: {cost.gpu_seconds_per_token * 1e3:.1f} ms a token ({cost.gpu_note})")
    console.print(f"hit rates: synthetic trace, locality {args.locality}, seed {args.seed}, learn {cut:,} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
