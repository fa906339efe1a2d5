"""The planner: model facts + host facts + GPUs + serving shape (+ routing statistics, bandwidth) -> a Plan.

Pure: every input is a typed model read elsewhere; `plan_for_host` is the one helper that reads them all from
this machine (and the files named) for callers such as the serving entrypoint.

GPU side, per tensor-parallel rank (every rank caches the same experts, each its own shard of them):
    budget     = gpu_memory_utilization x total memory
    weights    = the non-expert weights this rank holds
    KV         = KV_CACHE_MEMORY_BYTES (given, or derived for max_model_len x max_num_seqs)
    workspace  = CUDA context + NCCL + graphs + activations for max_num_batched_tokens
    headroom   = a fixed guard against fragmentation
    staging    = room for one decode step's misses of one layer (top_k x max_num_seqs experts): the cache model
                 looks a step's experts up first and loads the misses after, so a miss never evicts an expert
                 the same step still needs; layers run one after another, so one buffer serves them all
    expert slots = what is left, in whole slots of one expert's shard
Host side: every rank keeps its shard of every routed expert in pinned memory (UVA), so the pinned pool is the
whole routed-expert set; the rest of the budget is the serving overhead and page cache.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from glm53.constants import GIB, format_gib
from glm53.errors import BadInput, Unavailable
from glm53.fsutil import GET_THE_CHECKPOINT, missing_directory
from glm53.host.facts import HostFacts, read_host_facts
from glm53.host.memory import HostMemory
from glm53.plan.cache.decode_cost import Bandwidth, CostModel, build_cost_model, read_probe_bandwidth
from glm53.plan.cache.slots import CachePlan, plan_cache
from glm53.plan.inputs.cpu_sets import CpuSets, plan_cpu_sets
from glm53.plan.inputs.gpus import GpuSpec, gpu_spec
from glm53.plan.inputs.host_budget import Infeasible, host_budget, host_memory_fix
from glm53.plan.inputs.kv import KvComparison, KvDerivation, compare_with_reported, derive_kv
from glm53.plan.inputs.model import ModelFacts, model_facts
from glm53.plan.inputs.shape import ServingShape, shape_from_profile
from glm53.plan.routing.traces import RoutingCounts, RoutingTrace, read_routing_stats

if TYPE_CHECKING:
    from glm53.plan.inputs.machine import Machine

PLAN_FORMAT = "glm53-plan"
PLAN_VERSION = 1


class GpuLedger(BaseModel):
    index: int
    name: str
    total_bytes: int
    budget_bytes: int
    weights_bytes: int
    kv_bytes: int
    workspace_bytes: int
    headroom_bytes: int
    expert_slots: int
    expert_slot_bytes: int
    expert_cache_bytes: int
    staging_slots: int = 0
    staging_bytes: int = 0
    unused_bytes: int


class HostLedger(BaseModel):
    mem_total_bytes: int
    budget_bytes: int
    budget_source: str
    pinned_pool_bytes: int
    serving_overhead_bytes: int
    page_cache_bytes: int
    outside_budget_bytes: int
    cpu_offload_gb: int


class KvPlan(BaseModel):
    derivation: KvDerivation
    kv_cache_memory_bytes: int
    kv_source: str
    tokens: int
    recipe_comparison: KvComparison


class Plan(BaseModel):
    format: str = PLAN_FORMAT
    version: int = PLAN_VERSION
    model: str
    model_source: str
    shape: ServingShape
    kv: KvPlan
    gpus: list[GpuLedger]
    host: HostLedger
    cpu_sets: CpuSets
    cache: CachePlan
    cost: CostModel
    predicted_tokens_per_s: float | None
    moe_layers: list[int]
    warnings: list[str]
    rankings_file: str | None = None
    target: str = Field("this host", description="what was planned for: this host, or the rig/options given")


def workspace_estimate(model: ModelFacts, shape: ServingShape) -> int:
    """CUDA context, cuBLAS and NCCL buffers (0.5 GiB), decode CUDA graphs (0.25 GiB) and the activations of
    one batch of max_num_batched_tokens: 8 hidden-sized bf16 buffers per token plus its top_k experts' gate/up
    outputs split over the ranks."""
    per_token = 8 * model.hidden_size * 2 + (
        model.num_experts_per_tok * model.moe_intermediate_size * 2 * 2 // shape.tensor_parallel_size
    )
    return GIB // 2 + GIB // 4 + shape.max_num_batched_tokens * per_token


def staging_slots_for(model: ModelFacts, shape: ServingShape) -> int:
    """Slots of staging room: one decode step's distinct experts of one layer, at most every routed expert."""
    return min(model.n_routed_experts, model.num_experts_per_tok * shape.max_num_seqs)


def _kv_plan(model: ModelFacts, shape: ServingShape, warnings: list[str]) -> KvPlan:
    """The KV cache: given, or derived for MAX_MODEL_LEN x MAX_NUM_SEQS; a warning when it holds less."""
    derivation = derive_kv(model, shape.tensor_parallel_size)
    if shape.kv_cache_memory_bytes is not None:
        kv_bytes, kv_source = shape.kv_cache_memory_bytes, "given"
    else:
        kv_bytes = derivation.bytes_for(shape.max_model_len, shape.max_num_seqs)
        kv_source = f"derived for {shape.max_model_len:,} tokens x {shape.max_num_seqs} sequence(s)"
    kv_tokens = derivation.tokens_for(kv_bytes, shape.max_num_seqs)
    if kv_tokens < shape.max_model_len:
        warnings.append(
            f"by the derivation, {kv_bytes:,} B of KV hold {kv_tokens:,} tokens, "
            f"{shape.max_model_len - kv_tokens:,} short of MAX_MODEL_LEN {shape.max_model_len:,}; "
            "vLLM checks this at start (the recipe's vLLM reported 264,160 tokens for 3,328,599,040 B: "
            "see the KV derivation)"
        )
    return KvPlan(
        derivation=derivation,
        kv_cache_memory_bytes=kv_bytes,
        kv_source=kv_source,
        tokens=kv_tokens,
        recipe_comparison=compare_with_reported(derivation),
    )


class _RankBytes(BaseModel):
    """What every rank holds besides its expert slots, and one slot's size."""

    slot_bytes: int
    weights: int
    kv: int
    workspace: int
    headroom: int
    staging_slots: int

    @property
    def staging(self) -> int:
        return self.staging_slots * self.slot_bytes

    @property
    def fixed(self) -> int:
        return self.weights + self.kv + self.workspace + self.headroom + self.staging


def _rank_bytes(model: ModelFacts, shape: ServingShape, kv_bytes: int) -> _RankBytes:
    tp = shape.tensor_parallel_size
    workspace = shape.gpu_workspace_bytes if shape.gpu_workspace_bytes is not None else workspace_estimate(model, shape)
    return _RankBytes(
        slot_bytes=model.expert_bytes_per_rank(tp),
        weights=model.non_expert_bytes_per_rank(tp),
        kv=kv_bytes,
        workspace=workspace,
        headroom=shape.gpu_headroom_bytes,
        staging_slots=staging_slots_for(model, shape),
    )


def _expert_slots(model: ModelFacts, gpus: list[GpuSpec], shape: ServingShape, rank: _RankBytes, kv: KvPlan) -> int:
    """The expert slots per rank: what the tightest GPU's budget leaves, at least top_k a layer, at most every
    expert; refuses a GPU already in use past its share, or one that cannot hold the minimum cache."""
    tp = shape.tensor_parallel_size
    layers = model.moe_layers
    min_slots = model.num_experts_per_tok * len(layers)
    free_per_gpu: list[int] = []
    for gpu in gpus:
        budget = int(gpu.total_bytes * shape.gpu_memory_utilization)
        if gpu.used_bytes > gpu.total_bytes - budget:
            raise Infeasible(
                f"GPU {gpu.index} already has {format_gib(gpu.used_bytes)} in use; GPU_MEMORY_UTILIZATION "
                f"{shape.gpu_memory_utilization} leaves only {format_gib(gpu.total_bytes - budget)} for others",
                constraint=f"gpu{gpu.index} memory in use",
                fix=f"stop what uses GPU {gpu.index}, or set GPU_MEMORY_UTILIZATION="
                f"{math.floor((gpu.total_bytes - gpu.used_bytes) / gpu.total_bytes * 100) / 100}",
            )
        free_per_gpu.append(budget - rank.fixed)
    tightest = min(range(len(gpus)), key=lambda i: free_per_gpu[i])
    gpu = gpus[tightest]
    fixed = rank.weights + rank.workspace + rank.headroom + rank.staging + min_slots * rank.slot_bytes
    budget_tight = int(gpu.total_bytes * shape.gpu_memory_utilization)
    if fixed > budget_tight:
        raise Infeasible(
            f"GPU {gpu.index}: weights {format_gib(rank.weights)} + workspace {format_gib(rank.workspace)} + "
            f"headroom {format_gib(rank.headroom)} + expert staging {format_gib(rank.staging)} + the minimum expert "
            f"cache ({model.num_experts_per_tok} slots x "
            f"{len(layers)} layers = {format_gib(min_slots * rank.slot_bytes)}) exceed its budget "
            f"{format_gib(budget_tight)}",
            constraint=f"gpu{gpu.index} memory",
            fix=f"more tensor parallelism (TENSOR_PARALLEL_SIZE={tp * 2}) or GPUs with at least "
            f"{format_gib((fixed + rank.kv) / shape.gpu_memory_utilization)} each",
        )
    slots = free_per_gpu[tightest] // rank.slot_bytes
    if slots < min_slots:
        kv_fit = budget_tight - fixed
        tokens_fit = kv.derivation.tokens_for(kv_fit, shape.max_num_seqs)
        raise Infeasible(
            f"GPU {gpu.index}: after weights, {format_gib(rank.kv)} of KV and workspace, room is left for "
            f"{max(0, slots)} "
            f"expert slots; every MoE layer needs {model.num_experts_per_tok} ({min_slots} in all)",
            constraint=f"gpu{gpu.index} memory (KV cache)",
            fix=f"the largest context that fits is {tokens_fit:,} tokens: set MAX_MODEL_LEN={tokens_fit} and "
            f"KV_CACHE_MEMORY_BYTES={kv_fit}, or raise GPU_MEMORY_UTILIZATION",
        )
    return min(slots, model.n_routed_experts * len(layers))


def _host_ledger(model: ModelFacts, memory: HostMemory, shape: ServingShape, slot_bytes: int) -> HostLedger:
    """Every rank's shard of every routed expert pinned, plus the serving overhead, within the host's budget."""
    tp = shape.tensor_parallel_size
    host_budget_bytes, budget_source = host_budget(memory, shape.host_reserve_bytes)
    pinned_pool = tp * slot_bytes * model.total_experts
    needed_host = pinned_pool + shape.serving_overhead_bytes
    if needed_host > host_budget_bytes:
        raise Infeasible(
            f"host memory: the pinned expert pool {format_gib(pinned_pool)} ({tp} ranks x {model.total_experts:,} "
            f"experts x {slot_bytes:,} B) + serving overhead {format_gib(shape.serving_overhead_bytes)} exceed "
            f"the budget {format_gib(host_budget_bytes)} ({budget_source})",
            constraint="host memory",
            fix=host_memory_fix(memory, needed_host, shape.host_reserve_bytes),
        )
    return HostLedger(
        mem_total_bytes=memory.mem_total_bytes,
        budget_bytes=host_budget_bytes,
        budget_source=budget_source,
        pinned_pool_bytes=pinned_pool,
        serving_overhead_bytes=shape.serving_overhead_bytes,
        page_cache_bytes=host_budget_bytes - needed_host,
        outside_budget_bytes=memory.mem_total_bytes - host_budget_bytes,
        cpu_offload_gb=math.ceil(slot_bytes * model.total_experts / GIB),
    )


def _gpu_ledgers(gpus: list[GpuSpec], shape: ServingShape, rank: _RankBytes, cache: CachePlan) -> list[GpuLedger]:
    cache_bytes = cache.total_slots * rank.slot_bytes
    ledgers = []
    for spec in gpus:
        budget = int(spec.total_bytes * shape.gpu_memory_utilization)
        ledgers.append(
            GpuLedger(
                index=spec.index,
                name=spec.name,
                total_bytes=spec.total_bytes,
                budget_bytes=budget,
                weights_bytes=rank.weights,
                kv_bytes=rank.kv,
                workspace_bytes=rank.workspace,
                headroom_bytes=rank.headroom,
                expert_slots=cache.total_slots,
                expert_slot_bytes=rank.slot_bytes,
                expert_cache_bytes=cache_bytes,
                staging_slots=rank.staging_slots,
                staging_bytes=rank.staging,
                unused_bytes=budget - rank.fixed - cache_bytes,
            )
        )
    return ledgers


def _check_request(model: ModelFacts, gpus: list[GpuSpec], shape: ServingShape) -> None:
    tp = shape.tensor_parallel_size
    if len(gpus) < tp:
        raise Infeasible(
            f"tensor parallelism {tp} needs {tp} GPUs, {len(gpus)} given",
            constraint="gpus",
            fix=f"set TENSOR_PARALLEL_SIZE={len(gpus)} or add GPUs" if gpus else "give --gpu-memory",
        )
    if shape.max_model_len > model.max_position_embeddings:
        raise BadInput(
            f"MAX_MODEL_LEN {shape.max_model_len:,} exceeds the model's {model.max_position_embeddings:,} positions",
            fix=f"set MAX_MODEL_LEN to at most {model.max_position_embeddings}",
        )


def _check_trace_top_k(model: ModelFacts, stats: RoutingTrace | RoutingCounts | None, source: str) -> None:
    if isinstance(stats, RoutingTrace) and stats.top_k != model.num_experts_per_tok:
        raise BadInput(
            f"routing trace {source or '(given)'} was recorded with top_k {stats.top_k}, "
            f"the model routes each token to {model.num_experts_per_tok} experts (top_k "
            f"{model.num_experts_per_tok})",
            fix="record the trace with this model, or give routing counts instead",
        )


def build_plan(
    model: ModelFacts,
    host: HostFacts,
    gpus: list[GpuSpec],
    shape: ServingShape,
    *,
    stats: RoutingTrace | RoutingCounts | None = None,
    stats_source: str = "",
    bandwidth: Bandwidth | None = None,
    learn_fraction: float = 0.8,
) -> Plan:
    """The plan, stage by stage: the KV cache, the expert slots the tightest GPU leaves, the pinned host pool, the
    slots' split per layer (from the routing statistics), the CPU sets and the predicted decode rate."""
    tp = shape.tensor_parallel_size
    warnings: list[str] = []
    _check_request(model, gpus, shape)
    used_gpus = gpus[:tp]
    kv = _kv_plan(model, shape, warnings)
    rank = _rank_bytes(model, shape, kv.kv_cache_memory_bytes)
    slots = _expert_slots(model, used_gpus, shape, rank, kv)
    memory = host.require_memory()
    host_ledger = _host_ledger(model, memory, shape, rank.slot_bytes)
    _check_trace_top_k(model, stats, stats_source)
    cache = plan_cache(
        stats,
        model.moe_layers,
        model.n_routed_experts,
        slots,
        min_slots=model.num_experts_per_tok,
        learn_fraction=learn_fraction,
        source=stats_source,
    )
    cpu_sets = plan_cpu_sets(
        host.require_topology(),
        tp,
        shape.pool_threads,
        # A GPU known only by its size (flags) has no PCI address, so no node: say so rather than guess.
        gpu_nodes=[g.numa_node for g in used_gpus] if all(g.pci_bus_id for g in used_gpus) else None,
    )
    if not any(cpu_sets.pools):
        warnings.append("no CPU pool threads: every core stays with serving (too few cores per L3 domain)")
    cost = build_cost_model(
        model,
        kv.derivation,
        tensor_parallel_size=tp,
        bandwidth=bandwidth,
        context_tokens=shape.decode_context_tokens,
        gpu_memory_bandwidth=min(g.memory_bandwidth for g in used_gpus),
    )
    needed_host = host_ledger.pinned_pool_bytes + host_ledger.serving_overhead_bytes
    if memory.mem_available_bytes is not None and memory.mem_available_bytes < needed_host:
        warnings.append(
            f"MemAvailable is {format_gib(memory.mem_available_bytes)} now; the plan pins "
            f"{format_gib(needed_host)}: stop other memory users before serving"
        )
    return Plan(
        model=model.name,
        model_source=model.source,
        shape=shape,
        kv=kv,
        gpus=_gpu_ledgers(used_gpus, shape, rank, cache),
        host=host_ledger,
        cpu_sets=cpu_sets,
        cache=cache,
        cost=cost,
        predicted_tokens_per_s=(
            cost.tokens_per_s(cache.expected_hit_rate) if cache.expected_hit_rate is not None else None
        ),
        moe_layers=list(model.moe_layers),
        warnings=warnings,
    )


def plan_for_host(
    shape: ServingShape,
    *,
    model_dir: Path | None = None,
    stats_path: Path | None = None,
    gpus: list[GpuSpec] | None = None,
    bandwidth_path: Path | None = None,
    root: Path = Path("/"),
    learn_fraction: float = 0.8,
    target: Machine | None = None,
) -> Plan:
    """Read every fact from this machine (under `root`) and the files named, then plan; `target` (a rig,
    --ram, --cpus) replaces the parts of this machine it describes, `gpus` its GPUs."""
    if model_dir is not None and (missing := missing_directory(model_dir)) is not None:
        raise BadInput(
            f"--model-dir {model_dir} {missing}",
            fix=f"{GET_THE_CHECKPOINT}; without --model-dir the plan uses the published model facts",
        )
    host = read_host_facts(root, engine_libraries=None)
    if target is not None:
        host = target.apply(host)
    described = gpus if gpus is not None else target.gpus() if target is not None else None
    found = described if described is not None else [gpu_spec(gpu, root) for gpu in host.gpus]
    if not found:
        raise Unavailable(
            "no NVIDIA GPU found on this machine",
            fix="plan for the recipe's rig with --rig recipe-2x3090, or describe the GPUs with "
            "--gpu-memory 24GiB,24GiB (and the target's --ram and --cpus)",
        )
    stats = read_routing_stats(stats_path) if stats_path is not None else None
    try:
        plan = build_plan(
            model_facts(model_dir),
            host,
            found,
            shape,
            stats=stats,
            stats_source=str(stats_path) if stats_path is not None else "",
            bandwidth=read_probe_bandwidth(bandwidth_path) if bandwidth_path is not None else None,
            learn_fraction=learn_fraction,
        )
    except Infeasible as exc:
        if exc.constraint == "host memory" and (target is None or target.ram() is None):
            # This machine's RAM was used: say how to plan for the one the GPUs are in.
            exc.fix = (
                f"{exc.fix}; this is this machine's RAM: to plan for another machine, give its --ram (and "
                "--cpus), or --rig recipe-2x3090 for the recipe's"
            )
        raise
    parts = [target.describe()] if target is not None and target.described else []
    if gpus is not None:
        parts.append("GPUs " + ", ".join(f"{gpu.total_bytes / GIB:g} GiB" for gpu in gpus))
    if parts:
        whole = target is not None and target.ram() is not None and target.topology() is not None and described
        rest = "" if whole else " (what is not described: this host)"
        plan = plan.model_copy(update={"target": "; ".join(parts) + rest})
    return plan


__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "GpuLedger",
    "GpuSpec",
    "HostLedger",
    "Infeasible",
    "KvPlan",
    "Plan",
    "ServingShape",
    "build_plan",
    "host_budget",
    "plan_for_host",
    "shape_from_profile",
    "staging_slots_for",
    "workspace_estimate",
]
