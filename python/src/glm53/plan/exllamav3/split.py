"""The ExLlamaV3 engine's plan: which layers each GPU holds in layer split, which routed experts run on the CPU,
how much RAM that takes, and the decode rate to expect.

    plan_exl3(model, gpus, host, shape) -> Exl3Plan      pure; Infeasible names the number that does not fit

ExLlamaV3 1.4.6 (`exllamav3/model/model_ls.py`, `_load_autosplit`) loads modules in order onto the first GPU
until torch's memory fraction for that device (TabbyAPI's `gpu_split`, GiB per device) is reached, then moves
to the next. Everything torch allocates counts against that fraction: the weights, the KV cache and recurrent
state attached to each layer, the measuring forward's activations, and the caching allocator's fragmentation
(the cap is on reserved memory). The CUDA context does not (it is outside torch's allocator). ExLlamaV3 turns
gpu_split into bytes as int(GiB x 1024**3), so the planner floors each value to the 0.01 GiB it writes and plans
against exactly that. So the ledger per GPU is

    gpu_split = floor_0.01GiB(memory - used by others - CUDA context - headroom)      the torch cap
    budget    = gpu_split - allocator slack
    budget   >= non-expert weights + resident experts + DSA KV cache + KDA state of its layers + scratch

What does not fit goes to the CPU worker (`exllamav3/modules/block_sparse_mlp_cpu.py`), in one of two modes:

- split (EXL3_MOE_CPU_SPLIT=k, EXL3_MOE_CPU_SPLIT_LAYERS=L): the k coldest routed experts of each of the first
  L eligible MoE layers live in RAM and run on the CPU, overlapped with the layer's GPU expert work;
- offload (TabbyAPI's cpu_moe_offload_layers=N): every routed expert of the first N MoE layers runs on the CPU.

The counts come from the shortfall (the smallest k, then the smallest L, that make the rest fit), never from a
guess; the mode with the higher predicted decode rate wins unless the caller chooses one.

The decode rate is a bandwidth model, per token and MoE layer: the GPU reads the layer's non-expert weights and
its GPU-resident selected experts; the CPU reads its selected experts at the host's effective expert-kernel
rate, plus a fixed hand-off per layer with CPU work. In split mode the CPU part overlaps the GPU's expert part
(the worker is fed before the GPU experts run and collected after); in offload mode it does not. The share of
selections that land on the CPU is the share of routing counts on the CPU-resident experts when routing
statistics are given, else uniform (k of E), which is what dynamic placement starts from and the least it can
do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.constants import GIB, MIB
from glm53.errors import BadInput, Unavailable, invalid_document
from glm53.host import facts as host_facts
from glm53.host.memory import HostMemory
from glm53.host.rig import rig_topology
from glm53.plan.cache.decode_cost import CPU_HANDOFF_SECONDS, CPU_KERNEL_EFFICIENCY, GPU_KERNEL_EFFICIENCY
from glm53.plan.cache.policies import exl3_dynamic
from glm53.plan.cache.recommend import Recommendation
from glm53.plan.exllamav3.expert_cache import (
    ASSUMED_LINK_BYTES_PER_S,
    CacheChoice,
    CachePrediction,
    CacheSize,
    arena_bytes,
    predict_cache,
    size_cache,
)
from glm53.plan.inputs.cpu_sets import plan_cpu_sets
from glm53.plan.inputs.gpus import GpuSpec, gpu_spec
from glm53.plan.inputs.host_budget import Infeasible, host_budget
from glm53.plan.inputs.model import ModelFacts, model_facts
from glm53.plan.routing.traces import RoutingCounts, RoutingTrace, read_routing_stats

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from glm53.host.rig import Rig

Mode = Literal["gpu", "split", "offload"]
ModeChoice = Literal["auto", "split", "offload"]

# CUDA context, cuBLAS workspace and the driver's own allocations per device, outside torch's allocator
# (0.4-0.6 GiB on Ampere and Hopper with torch 2.x; the upper end).
CUDA_CONTEXT_BYTES = 600 * MIB
# Allocator fragmentation and the caching allocator's slack over the measured peak.
ALLOCATOR_SLACK_BYTES = 768 * MIB
# Kept free on every GPU beyond the ledger (a display, a second process).
HEADROOM_BYTES = 256 * MIB
# The worker process's own RAM beyond the experts it holds: the job ring in pinned shared memory, per-thread
# scratch and the Python interpreter with torch (measured on the H200: about 1.5 GiB resident before experts).
WORKER_OVERHEAD_BYTES = 2 * GIB
# TabbyAPI's process: torch, CUDA host allocations, the tokenizer, the server (about 3-4 GiB resident).
SERVER_OVERHEAD_BYTES = 4 * GIB
# Assumed host memory bandwidth when none is given: dual-channel DDR5 or quad-channel DDR4, effective.
ASSUMED_HOST_MEMORY_BANDWIDTH = 60e9
CACHE_PAGE = 256  # TabbyAPI: cache_size is a multiple of 256 tokens


class Exl3Shape(BaseModel):
    """What the profile asks of the engine (profile key names in the comments)."""

    model_config = ConfigDict(frozen=True)

    gpus: int = Field(default=1, ge=1, le=64)  # GPUS: the first N GPUs the layers are split over
    max_model_len: int = Field(default=131_072, gt=0)  # MAX_MODEL_LEN
    cache_size: int | None = Field(default=None, gt=0)  # CACHE_SIZE; None = max_model_len x sequences
    cache_bits: tuple[int, int] = (16, 16)  # CACHE_MODE as key and value bits
    max_num_seqs: int = Field(default=1, ge=1)  # MAX_NUM_SEQS
    chunk_size: int = Field(default=2048, gt=0)  # CHUNK_SIZE
    mode: ModeChoice = "auto"
    host_reserve_bytes: int = Field(default=8 * GIB, ge=0)  # RAM left to the system
    host_memory_bandwidth: float = Field(default=ASSUMED_HOST_MEMORY_BANDWIDTH, gt=0)
    host_bandwidth_source: str = "assumed: 60 GB/s effective host memory bandwidth"
    pool_threads: int | None = Field(default=None, ge=1)
    decode_context_tokens: int = Field(default=8192, gt=0)
    expert_cache: bool = False  # EXPERT_CACHE=1: routed experts served through glm53's GPU expert cache


class Exl3GpuLedger(BaseModel):
    index: int
    name: str
    total_bytes: int
    used_by_others_bytes: int
    cuda_context_bytes: int
    headroom_bytes: int
    gpu_split_bytes: int  # torch's cap here: TabbyAPI's gpu_split for this device, as ExLlamaV3 reads it
    allocator_slack_bytes: int  # inside the cap, left to the caching allocator's fragmentation
    budget_bytes: int  # what the ledger below may fill: gpu_split - allocator slack
    layers: list[int]  # decoder layers placed here, in order
    non_expert_bytes: int
    expert_bytes: int
    resident_experts: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    scratch_bytes: int
    head_bytes: int
    free_bytes: int


class Exl3HostLedger(BaseModel):
    budget_bytes: int
    budget_source: str
    cpu_experts: int
    cpu_expert_bytes: int
    worker_overhead_bytes: int
    server_overhead_bytes: int
    free_bytes: int


class Exl3Offload(BaseModel):
    mode: Mode
    # split: experts per layer on the CPU and the number of layers split; offload: whole layers.
    split_experts: int = 0
    split_layers: int = 0
    offload_layers: int = 0
    cpu_layers: list[int] = []  # the MoE layers with routed experts on the CPU
    shortfall_bytes: int
    reason: str


class Exl3Prediction(BaseModel):
    mode: Mode
    tokens_per_s: float
    gpu_seconds: float
    cpu_seconds: float
    cpu_share: float  # share of routed selections computed on the CPU
    cpu_share_source: str


class PlacementComparison(BaseModel):
    """CPU share of routed selections on the held-out part of a trace, for each placement of k experts per layer."""

    split_experts: int
    learn_steps: int
    scored_steps: int
    static_cpu_share: float  # the coldest k of the learning part on the CPU, never moved
    dynamic_cpu_share: float  # ExLlamaV3's swap sweeps from the tail start, over the whole trace
    uniform_cpu_share: float  # k / E
    swaps: int
    winner: Literal["static", "dynamic"]
    verdict: str


class Exl3Plan(BaseModel):
    engine: Literal["exllamav3"] = "exllamav3"
    model: str
    model_source: str
    shape: Exl3Shape
    cache_size: int
    kv_bytes_per_token: int
    recurrent_bytes_per_sequence: int
    gpus: list[Exl3GpuLedger]
    host: Exl3HostLedger
    offload: Exl3Offload
    prediction: Exl3Prediction
    alternatives: list[Exl3Prediction]
    cpu_pool: list[int]
    main_cpus: list[int]
    threads: int
    env: dict[str, str]
    origins: dict[str, str]
    warnings: list[str]
    # With a routing trace: static placement learned on its first half against dynamic placement.
    placement: PlacementComparison | None = None
    split_stats_file: str | None = None  # EXL3_MOE_CPU_SPLIT_STATS written beside the plan
    # With a routing trace and a split: the recommended placement setting (glm53.plan.cache.recommend), whose
    # variables plan.env carries.
    recommendation: Recommendation | None = None
    # EXPERT_CACHE=1: the GPU expert cache's slots per layer, sized from what the GPUs hold besides the experts,
    # and (with a routing trace) the pinned share chosen for it.
    expert_cache: CacheSize | None = None
    cache_choice: CacheChoice | None = None
    cache_prediction: CachePrediction | None = None


def parse_cache_mode(value: str) -> tuple[int, int]:
    """TabbyAPI's cache_mode as (key bits, value bits): FP16 -> (16, 16), Q6 -> (6, 6), '8,4' -> (8, 4)."""
    text = value.strip().upper()
    if text in ("", "FP16"):
        return (16, 16)
    if text in ("Q8", "Q6", "Q4"):
        bits = int(text[1])
        return (bits, bits)
    parts = [part.strip() for part in text.split(",")]
    if len(parts) == 2 and all(part.isdigit() and 2 <= int(part) <= 8 for part in parts):
        return (int(parts[0]), int(parts[1]))
    raise BadInput(f"CACHE_MODE={value!r} is not a cache mode", fix="FP16, Q8, Q6, Q4 or two bit widths like 8,6")


def kv_bytes_per_token(model: ModelFacts, bits: tuple[int, int]) -> int:
    """DSA layers cache one compressed latent (kv_lora_rank + rope dims) and one indexer key per token. At FP16
    both are 2 bytes a value; a quantized mode stores the latent at its key bits plus an fp16 scale per 32
    values, the indexer key stays fp16 (it feeds the top-k selection)."""
    latent_values = model.kv_lora_rank + model.qk_rope_head_dim
    if bits == (16, 16):
        latent = latent_values * 2
    else:
        latent = math.ceil(latent_values * bits[0] / 8) + 2 * math.ceil(latent_values / 32)
    indexer = model.index_head_dim * 2
    return len(model.dsa_layers) * (latent + indexer)


def recurrent_bytes_per_layer(model: ModelFacts) -> int:
    state = model.kda_state
    return state.recurrent_bytes() + state.conv_bytes()


def scratch_bytes(model: ModelFacts, shape: Exl3Shape) -> int:
    """Activations of one prompt chunk: the hyper-connection residual streams (4 x hidden), about eight more
    hidden-sized buffers, and the selected experts' gate and up outputs, all 2 bytes a value."""
    per_token = (4 + 8) * model.hidden_size * 2 + model.num_experts_per_tok * model.moe_intermediate_size * 2 * 2
    return shape.chunk_size * per_token


def layer_non_expert_bytes(model: ModelFacts) -> list[int]:
    """Non-expert bytes per decoder layer: spread evenly (the published facts give only the total)."""
    total = model.non_expert_replicated_bytes + model.non_expert_sharded_bytes
    layers = model.num_hidden_layers
    base, extra = divmod(total, layers)
    return [base + (1 if n < extra else 0) for n in range(layers)]


def _cpu_share(
    model: ModelFacts, cpu_experts: dict[int, int], counts: dict[int, Sequence[float]] | None
) -> tuple[float, str]:
    """Share of all routed selections that fall on CPU-resident experts (the coldest per layer with counts)."""
    moe = model.moe_layers
    if not cpu_experts:
        return 0.0, "no expert on the CPU"
    total = 0.0
    for layer in moe:
        k = cpu_experts.get(layer, 0)
        if k == 0:
            continue
        layer_counts = counts.get(layer) if counts else None
        if layer_counts and sum(layer_counts) > 0:
            coldest = sorted(layer_counts)[:k]
            total += sum(coldest) / sum(layer_counts)
        else:
            total += k / model.n_routed_experts
    share = total / len(moe)
    source = "routing statistics (the coldest experts on the CPU)" if counts else "uniform routing (k of E)"
    return share, source


def predict(
    model: ModelFacts,
    gpus: Sequence[GpuSpec],
    shape: Exl3Shape,
    mode: Mode,
    cpu_experts: dict[int, int],
    counts: dict[int, Sequence[float]] | None = None,
) -> Exl3Prediction:
    """Seconds per decoded token -> tokens per second (see the module's docstring)."""
    gpu_bw = min(g.memory_bandwidth for g in gpus[: shape.gpus]) * GPU_KERNEL_EFFICIENCY
    cpu_bw = shape.host_memory_bandwidth * CPU_KERNEL_EFFICIENCY
    expert = model.expert_bytes
    top_k = model.num_experts_per_tok
    non_expert = sum(layer_non_expert_bytes(model))
    # Sparse attention reads the indexer keys of the whole context and the latents of its top-k tokens.
    attention = shape.decode_context_tokens * len(model.dsa_layers) * model.index_head_dim * 2
    gpu_seconds = (non_expert + attention) / gpu_bw
    cpu_seconds = 0.0
    share_total = 0.0
    for layer in model.moe_layers:
        k = cpu_experts.get(layer, 0)
        layer_counts = counts.get(layer) if counts else None
        if k and layer_counts and sum(layer_counts) > 0:
            share = sum(sorted(layer_counts)[:k]) / sum(layer_counts)
        else:
            share = k / model.n_routed_experts
        share_total += share
        gpu_part = top_k * (1 - share) * expert / gpu_bw
        cpu_part = (top_k * share * expert / cpu_bw + CPU_HANDOFF_SECONDS) if k else 0.0
        cpu_seconds += cpu_part
        if mode == "split":
            gpu_seconds += max(gpu_part, cpu_part)
        else:
            gpu_seconds += gpu_part + cpu_part
    _, source = _cpu_share(model, cpu_experts, counts)
    return Exl3Prediction(
        mode=mode,
        tokens_per_s=round(1.0 / gpu_seconds, 2),
        gpu_seconds=gpu_seconds,
        cpu_seconds=cpu_seconds,
        cpu_share=round(share_total / max(1, len(model.moe_layers)), 4),
        cpu_share_source=source,
    )


def _size(count: int) -> str:
    """Bytes in GiB, or in MiB below one GiB (a small model's parts would all read 0.01 GiB)."""
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / MIB:.1f} MiB"


def _place(
    model: ModelFacts,
    gpus: Sequence[GpuSpec],
    shape: Exl3Shape,
    budgets: list[int],
    cpu_experts: dict[int, int],
    cache_size: int,
) -> list[Exl3GpuLedger] | None:
    """Layers in order onto the first GPU until its budget is spent, then the next (ExLlamaV3's layer split).
    None when the model does not fit."""
    non_expert = layer_non_expert_bytes(model)
    kv_layer = kv_bytes_per_token(model, shape.cache_bits) // max(1, len(model.dsa_layers))
    dsa = set(model.dsa_layers)
    moe = set(model.moe_layers)
    state = recurrent_bytes_per_layer(model) * shape.max_num_seqs
    scratch = scratch_bytes(model, shape)
    ledgers: list[Exl3GpuLedger] = []
    layer = 0
    for index, gpu in enumerate(gpus[: shape.gpus]):
        budget = budgets[index]
        used = scratch
        placed: list[int] = []
        sums = {"non_expert": 0, "experts": 0, "resident": 0, "kv": 0, "state": 0}
        while layer < model.num_hidden_layers:
            resident = model.n_routed_experts - cpu_experts.get(layer, 0) if layer in moe else 0
            cost = {
                "non_expert": non_expert[layer],
                "experts": resident * model.expert_bytes,
                "kv": cache_size * kv_layer if layer in dsa else 0,
                "state": 0 if layer in dsa else state,
            }
            if used + sum(cost.values()) > budget:
                break
            used += sum(cost.values())
            for key, value in cost.items():
                sums[key] += value
            sums["resident"] += resident
            placed.append(layer)
            layer += 1
        ledgers.append(
            Exl3GpuLedger(
                index=gpu.index,
                name=gpu.name,
                total_bytes=gpu.total_bytes,
                used_by_others_bytes=gpu.used_bytes,
                cuda_context_bytes=CUDA_CONTEXT_BYTES,
                headroom_bytes=HEADROOM_BYTES,
                gpu_split_bytes=budget + ALLOCATOR_SLACK_BYTES,
                allocator_slack_bytes=ALLOCATOR_SLACK_BYTES,
                budget_bytes=budget,
                layers=placed,
                non_expert_bytes=sums["non_expert"],
                expert_bytes=sums["experts"],
                resident_experts=sums["resident"],
                kv_cache_bytes=sums["kv"],
                recurrent_state_bytes=sums["state"],
                scratch_bytes=scratch,
                head_bytes=0,
                free_bytes=budget - used,
            )
        )
    return ledgers if layer >= model.num_hidden_layers else None


def gpu_split_gib(gpu: GpuSpec) -> str:
    """TabbyAPI's gpu_split value for this GPU: what torch may reserve, in GiB floored to 2 decimals."""
    hundredths = max(0, gpu.total_bytes - gpu.used_bytes - CUDA_CONTEXT_BYTES - HEADROOM_BYTES) * 100 // GIB
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def gpu_budget(gpu: GpuSpec) -> int:
    """Bytes the ledger may fill on this GPU: the gpu_split cap exactly as ExLlamaV3 converts it
    (`int(x * 1024**3)`, model.py), less the allocator's slack."""
    return int(float(gpu_split_gib(gpu)) * 1024**3) - ALLOCATOR_SLACK_BYTES


def _split_counts(model: ModelFacts, k: int, layers: int) -> dict[int, int]:
    return {layer: k for layer in model.moe_layers[:layers]}


def _offload_counts(model: ModelFacts, layers: int) -> dict[int, int]:
    return {layer: model.n_routed_experts for layer in model.moe_layers[:layers]}


def _fits(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cpu: dict[int, int], cache: int
) -> list[Exl3GpuLedger] | None:
    return _place(model, gpus, shape, budgets, cpu, cache)


def _smallest_split(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cache: int
) -> tuple[int, int, list[Exl3GpuLedger]] | None:
    """The fewest experts per layer, then the fewest layers, that make the model fit (k < E: a layer with every
    expert on the CPU is whole-layer offload)."""
    n_moe = len(model.moe_layers)
    for k in range(1, model.n_routed_experts):
        if _fits(model, gpus, shape, budgets, _split_counts(model, k, n_moe), cache) is None:
            continue
        low, high = 1, n_moe  # the fewest layers at this k: fitting is monotone in the layer count
        while low < high:
            mid = (low + high) // 2
            if _fits(model, gpus, shape, budgets, _split_counts(model, k, mid), cache) is not None:
                high = mid
            else:
                low = mid + 1
        best = _fits(model, gpus, shape, budgets, _split_counts(model, k, low), cache)
        assert best is not None
        return k, low, best
    return None


def _smallest_offload(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cache: int
) -> tuple[int, list[Exl3GpuLedger]] | None:
    for layers in range(1, len(model.moe_layers) + 1):
        if (ledgers := _fits(model, gpus, shape, budgets, _offload_counts(model, layers), cache)) is not None:
            return layers, ledgers
    return None


# A way to place the model: the mode, the routed experts each layer runs on the CPU, the GPU ledgers, the offload.
_Placement = tuple[Mode, dict[int, int], list[Exl3GpuLedger], Exl3Offload]


def _cache_size(model: ModelFacts, shape: Exl3Shape) -> int:
    """The KV cache in tokens (MAX_MODEL_LEN x MAX_NUM_SEQS unless given), in whole pages; refuses a cache or a
    context the engine cannot hold."""
    cache_size = shape.cache_size or shape.max_model_len * shape.max_num_seqs
    cache_size = -(-cache_size // CACHE_PAGE) * CACHE_PAGE
    if cache_size < shape.max_model_len:
        raise BadInput(
            f"CACHE_SIZE={cache_size} is below MAX_MODEL_LEN={shape.max_model_len}",
            fix="TabbyAPI needs a cache at least as long as the context: raise CACHE_SIZE or leave it empty",
        )
    if shape.max_model_len > model.max_position_embeddings:
        raise BadInput(
            f"MAX_MODEL_LEN={shape.max_model_len:,} is beyond the model's {model.max_position_embeddings:,} positions",
            fix=f"set MAX_MODEL_LEN to at most {model.max_position_embeddings}",
        )
    return cache_size


def _require_gpus(gpus: Sequence[GpuSpec], shape: Exl3Shape, gpu_source: str) -> None:
    if len(gpus) < shape.gpus:
        raise Infeasible(
            f"the profile splits the layers over {shape.gpus} GPUs, {len(gpus)} found ({gpu_source})",
            constraint="gpus",
            fix=f"use a profile for {len(gpus)} GPU(s) (e.g. exl3-1gpu), or --set GPUS={len(gpus)}",
        )


def _gpu_budgets(gpus: Sequence[GpuSpec], shape: Exl3Shape) -> list[int]:
    """What each GPU the profile splits over may hold; refuses one with no room at all."""
    budgets = [gpu_budget(gpu) for gpu in gpus[: shape.gpus]]
    for gpu, budget in zip(gpus, budgets, strict=False):
        if budget <= 0:
            raise Infeasible(
                f"GPU {gpu.index} ({gpu.name}) has {(gpu.total_bytes - gpu.used_bytes) / GIB:.2f} GiB free, "
                f"not more than the CUDA context, slack and headroom "
                f"({(CUDA_CONTEXT_BYTES + HEADROOM_BYTES + ALLOCATOR_SLACK_BYTES) / GIB:.2f} GiB)",
                constraint="gpu memory",
                fix="free the GPU (nvidia-smi shows what holds it) or leave it out with GPUS",
            )
    return budgets


def _split_placement(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cache_size: int, shortfall: int
) -> _Placement | None:
    """The fewest coldest experts per layer, over the fewest layers, on the CPU."""
    found = _smallest_split(model, gpus, shape, budgets, cache_size)
    if found is None:
        return None
    k, layers, ledgers = found
    reason = (
        f"{shortfall / GIB:.2f} GiB do not fit on the GPUs: the {k} coldest of "
        f"{model.n_routed_experts} experts of {layers} MoE layers run on the CPU "
        f"({k * layers * model.expert_bytes / GIB:.2f} GiB)"
    )
    offload = Exl3Offload(
        mode="split",
        split_experts=k,
        split_layers=layers,
        cpu_layers=list(model.moe_layers[:layers]),
        shortfall_bytes=shortfall,
        reason=reason,
    )
    return "split", _split_counts(model, k, layers), ledgers, offload


def _offload_placement(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cache_size: int, shortfall: int
) -> _Placement | None:
    """The fewest whole MoE layers on the CPU."""
    found = _smallest_offload(model, gpus, shape, budgets, cache_size)
    if found is None:
        return None
    layers, ledgers = found
    reason = (
        f"{shortfall / GIB:.2f} GiB do not fit on the GPUs: the routed experts of the first {layers} MoE "
        f"layers run on the CPU ({layers * model.n_routed_experts * model.expert_bytes / GIB:.2f} GiB)"
    )
    offload = Exl3Offload(
        mode="offload",
        offload_layers=layers,
        cpu_layers=list(model.moe_layers[:layers]),
        shortfall_bytes=shortfall,
        reason=reason,
    )
    return "offload", _offload_counts(model, layers), ledgers, offload


def _fixed_bytes(model: ModelFacts, shape: Exl3Shape, cache_size: int) -> tuple[int, int, int]:
    """(non-expert weights, KV cache, recurrent state) in bytes: what the GPUs hold whatever the experts do."""
    cache = cache_size * kv_bytes_per_token(model, shape.cache_bits)
    state = recurrent_bytes_per_layer(model) * len(model.kda_layers) * shape.max_num_seqs
    return sum(layer_non_expert_bytes(model)), cache, state


def _placements(
    model: ModelFacts, gpus: Sequence[GpuSpec], shape: Exl3Shape, budgets: list[int], cache_size: int
) -> list[_Placement]:
    """Every way the profile's mode allows that fits on the GPUs: all on the GPUs when it fits (auto), else the
    per-layer split and the whole-layer offload; refuses a model that fits in none."""
    weights, cache, state = _fixed_bytes(model, shape, cache_size)
    scratch = scratch_bytes(model, shape) * len(budgets)  # each GPU holds one prompt chunk's activations (`_place`)
    shortfall = max(0, weights + model.routed_expert_bytes + cache + state + scratch - sum(budgets))
    gpu_all = _fits(model, gpus, shape, budgets, {}, cache_size)
    if gpu_all is not None and shape.mode == "auto":
        offload = Exl3Offload(mode="gpu", shortfall_bytes=0, reason="every routed expert fits on the GPUs")
        return [("gpu", {}, gpu_all, offload)]
    found: list[_Placement | None] = []
    if shape.mode in ("auto", "split"):
        found.append(_split_placement(model, gpus, shape, budgets, cache_size, shortfall))
    if shape.mode in ("auto", "offload"):
        found.append(_offload_placement(model, gpus, shape, budgets, cache_size, shortfall))
    placements = [placement for placement in found if placement is not None]
    if not placements:
        fixed = weights + cache + state + scratch
        raise Infeasible(
            f"even with every routed expert on the CPU, the non-expert weights ({_size(weights)}), "
            f"the cache of {cache_size:,} tokens ({_size(cache)}), the recurrent state "
            f"({_size(state)}) and a prompt chunk of {shape.chunk_size:,} tokens "
            f"({_size(scratch)}) need {_size(fixed)}, more than the GPUs' {_size(sum(budgets))}"
            + (" (a layer's parts do not split across GPUs)" if fixed <= sum(budgets) else ""),
            constraint="gpu memory",
            fix="lower MAX_MODEL_LEN, MAX_NUM_SEQS or CHUNK_SIZE, use a quantized CACHE_MODE (Q8), or add a GPU",
        )
    return placements


def _host_need(model: ModelFacts, cpu: dict[int, int]) -> tuple[int, int, int]:
    """(expert bytes, worker overhead, all the RAM the engine needs) with these experts on the CPU."""
    experts = sum(cpu.values()) * model.expert_bytes
    worker = WORKER_OVERHEAD_BYTES if experts else 0
    return experts, worker, experts + worker + SERVER_OVERHEAD_BYTES


def _fitting_in_ram(
    model: ModelFacts, shape: Exl3Shape, placements: list[_Placement], host_budget: tuple[int, str], warnings: list[str]
) -> list[_Placement]:
    """The placements whose CPU experts also fit in RAM (the faster mode may hold more of them: whole-layer offload
    moves experts in steps of a layer); each dropped one is a warning, none left is infeasible."""
    budget, source = host_budget
    fitting = [c for c in placements if _host_need(model, c[1])[2] <= budget]
    if not fitting:
        _, cpu_least, _, _ = min(placements, key=lambda c: _host_need(model, c[1])[2])
        cpu_bytes, worker, needed = _host_need(model, cpu_least)
        ram = -(-(needed + shape.host_reserve_bytes) // (8 * GIB)) * 8
        raise Infeasible(
            f"the CPU worker holds {cpu_bytes / GIB:.2f} GiB of experts; with the worker and server "
            f"({(worker + SERVER_OVERHEAD_BYTES) / GIB:.1f} GiB) that is {needed / GIB:.2f} GiB, over the host's "
            f"budget of {budget / GIB:.2f} GiB ({source})",
            constraint="host memory",
            fix=f"a host with at least {ram} GiB of RAM, or more GPU memory",
        )
    for mode_dropped, cpu_dropped, _, _ in placements:
        if _host_need(model, cpu_dropped)[2] > budget:
            warnings.append(
                f"{mode_dropped} mode would need {_host_need(model, cpu_dropped)[2] / GIB:.2f} GiB of RAM, over the "
                f"budget of {budget / GIB:.2f} GiB: not considered"
            )
    return fitting


def _engine_keys(
    gpus: Sequence[GpuSpec], shape: Exl3Shape, placement: _Placement, cache_size: int, threads: int
) -> tuple[dict[str, str], dict[str, str]]:
    """The profile keys this placement sets, and why each has its value."""
    mode, cpu_experts, _, offload = placement
    env: dict[str, str] = {}
    origins: dict[str, str] = {}

    def put(key: str, value: str, why: str) -> None:
        env[key] = value
        origins[key] = why

    put(
        "GPU_SPLIT",
        ",".join(gpu_split_gib(gpu) for gpu in gpus[: shape.gpus]),
        "per-GPU torch cap: memory - used - CUDA context - headroom, floored to 0.01 GiB",
    )
    put("CACHE_SIZE", str(cache_size), f"MAX_MODEL_LEN x MAX_NUM_SEQS, in pages of {CACHE_PAGE}")
    if mode == "split":
        put("EXL3_MOE_CPU_SPLIT", str(offload.split_experts), "fewest CPU experts per layer that fit")
        put("EXL3_MOE_CPU_SPLIT_LAYERS", str(offload.split_layers), "fewest split layers that fit")
        put("CPU_MOE_OFFLOAD_LAYERS", "0", "split mode: no whole-layer offload")
    elif mode == "offload":
        put("CPU_MOE_OFFLOAD_LAYERS", str(offload.offload_layers), "fewest whole MoE layers on the CPU that fit")
        put("EXL3_MOE_CPU_SPLIT", "0", "offload mode: no per-layer split")
    else:
        put("CPU_MOE_OFFLOAD_LAYERS", "0", "every expert fits on the GPUs")
        put("EXL3_MOE_CPU_SPLIT", "0", "every expert fits on the GPUs")
    if sum(cpu_experts.values()):
        put("EXL3_MOE_CPU_THREADS", str(threads), "the planned CPU pool's threads")
    return env, origins


def plan_exl3(
    model: ModelFacts,
    gpus: Sequence[GpuSpec],
    shape: Exl3Shape,
    *,
    host_budget: tuple[int, str],
    cpu_pool: Sequence[int] = (),
    main_cpus: Sequence[int] = (),
    counts: dict[int, Sequence[float]] | None = None,
    gpu_source: str = "this host",
) -> Exl3Plan:
    """The layer split, the CPU expert offload and the host RAM for serving `model` with ExLlamaV3: every placement
    that fits the GPUs and then the RAM, the fastest predicted of them, and the keys that make the engine run it."""
    warnings: list[str] = []
    if counts is not None:
        check_counts(model, counts)
    _require_gpus(gpus, shape, gpu_source)
    cache_size = _cache_size(model, shape)
    budgets = _gpu_budgets(gpus, shape)
    fitting = _fitting_in_ram(model, shape, _placements(model, gpus, shape, budgets, cache_size), host_budget, warnings)
    predictions = [predict(model, gpus, shape, mode, cpu, counts) for mode, cpu, _, _ in fitting]
    best = max(range(len(fitting)), key=lambda i: predictions[i].tokens_per_s)
    _, cpu_experts, ledgers, offload = fitting[best]
    cpu_bytes, worker, needed = _host_need(model, cpu_experts)
    threads = len(cpu_pool) or 1
    if shape.pool_threads is not None:
        threads = min(threads, shape.pool_threads)
    env, origins = _engine_keys(gpus, shape, fitting[best], cache_size, threads)
    expert_cache = None
    cache_prediction = None
    if shape.expert_cache:
        # every routed expert on the GPUs only where the all-GPU placement fits; else host-resident experts
        resident_reason = None if fitting[best][0] == "gpu" else fitting[best][3].reason
        expert_cache = size_expert_cache(model, shape, budgets, cache_size, host_resident=resident_reason is not None)
        resident = predict(model, gpus, shape, "gpu", {}).gpu_seconds
        cache_prediction = predict_cache(expert_cache, model, resident)
        for key, (value, why) in expert_cache_keys(expert_cache, model, resident_reason).items():
            env[key] = value
            origins[key] = why
        env.pop("EXL3_MOE_CPU_THREADS", None)
        origins.pop("EXL3_MOE_CPU_THREADS", None)
        if resident_reason is not None:
            # every MoE layer's experts cross a link once a prefill pass (the GPUs of a layer split in turn)
            staging = len(model.moe_layers) * expert_cache.arena_bytes_per_gpu / ASSUMED_LINK_BYTES_PER_S
            warnings.append(
                "EXPERT_CACHE_EXPERTS=host: host-resident experts are verified on the tiny EXL3 fixture, not yet on "
                "this checkpoint; each prefill pass copies a layer's experts "
                f"({expert_cache.arena_bytes_per_gpu / GIB:.2f} GiB) before it runs, about {staging:.1f} s a pass "
                f"over every MoE layer at {ASSUMED_LINK_BYTES_PER_S / 1e9:g} GB/s "
                '(docs/serve.md, "The GPU expert cache")'
            )
    kv_token = kv_bytes_per_token(model, shape.cache_bits)
    if kv_token and cache_size * kv_token > sum(g.total_bytes for g in gpus[: shape.gpus]) // 4:
        warnings.append(
            f"the cache of {cache_size:,} tokens takes {cache_size * kv_token / GIB:.1f} GiB of VRAM that could "
            "hold experts; a shorter MAX_MODEL_LEN or CACHE_MODE=Q8 moves experts back to the GPU"
        )
    budget, source = host_budget
    return Exl3Plan(
        model=model.name,
        model_source=model.source,
        shape=shape,
        cache_size=cache_size,
        kv_bytes_per_token=kv_token,
        recurrent_bytes_per_sequence=recurrent_bytes_per_layer(model) * len(model.kda_layers),
        gpus=ledgers,
        host=Exl3HostLedger(
            budget_bytes=budget,
            budget_source=source,
            cpu_experts=sum(cpu_experts.values()),
            cpu_expert_bytes=cpu_bytes,
            worker_overhead_bytes=worker,
            server_overhead_bytes=SERVER_OVERHEAD_BYTES,
            free_bytes=budget - needed,
        ),
        offload=offload,
        prediction=predictions[best],
        alternatives=[p for i, p in enumerate(predictions) if i != best],
        cpu_pool=list(cpu_pool),
        main_cpus=list(main_cpus),
        threads=threads,
        env=env,
        origins=origins,
        warnings=warnings,
        expert_cache=expert_cache,
        cache_prediction=cache_prediction,
    )


def size_expert_cache(
    model: ModelFacts, shape: Exl3Shape, budgets: list[int], cache_size: int, *, host_resident: bool = False
) -> CacheSize:
    """The cache's slots per MoE layer. The decoder layers go to the GPUs in order, an equal count of MoE layers
    each (the last GPU may hold fewer); each GPU's budget, less its own layers' non-expert weights, KV cache and
    recurrent state (as the split's ledger counts them), the scratch and, with host-resident experts, the staging
    arena of one layer's experts, is its room for slots; the GPU with the least room decides."""
    arena = arena_bytes(model) if host_resident else 0
    non_expert = layer_non_expert_bytes(model)
    kv_layer = kv_bytes_per_token(model, shape.cache_bits) // max(1, len(model.dsa_layers))
    state = recurrent_bytes_per_layer(model) * shape.max_num_seqs
    dsa, moe = set(model.dsa_layers), set(model.moe_layers)
    per_gpu = math.ceil(len(moe) / shape.gpus)
    fixed = [scratch_bytes(model, shape) + arena] * shape.gpus
    gpu, held = 0, 0
    for layer in range(model.num_hidden_layers):
        if layer in moe and held == per_gpu:
            gpu, held = gpu + 1, 0
        held += layer in moe
        fixed[gpu] += non_expert[layer] + (cache_size * kv_layer if layer in dsa else state)
    rooms = [budget - used for budget, used in zip(budgets, fixed, strict=True)]
    room = min(rooms)
    if room <= 0:
        worst = rooms.index(room)
        raise Infeasible(
            f"EXPERT_CACHE=1: GPU {worst}'s budget ({budgets[worst] / GIB:.2f} GiB) holds no expert beside its "
            f"{fixed[worst] / GIB:.2f} GiB of non-expert weights, KV cache, recurrent state and scratch",
            constraint="gpu memory",
            fix="a shorter MAX_MODEL_LEN or CACHE_MODE=Q8, or more GPUs",
        )
    size = size_cache(model, room, gpus=shape.gpus, sequences=shape.max_num_seqs, flag="EXPERT_CACHE=1: the GPU budget")
    return size.model_copy(update={"arena_bytes_per_gpu": arena})


def expert_cache_keys(
    size: CacheSize, model: ModelFacts, resident_reason: str | None = None
) -> dict[str, tuple[str, str]]:
    """The engine keys of a sized cache (plain LRU: the pinned share comes with a routing trace), and why;
    `resident_reason`: why every routed expert does not fit the GPUs (then they are host-resident)."""
    per_layer = f"{size.cache_bytes_per_gpu / GIB:.2f} GiB a GPU over {size.layers_per_gpu} MoE layers"
    experts = (
        (
            "host",
            f"every routed expert does not fit the GPUs ({resident_reason}): in host memory only, one layer's "
            f"experts a GPU staged for prefill ({size.arena_bytes_per_gpu / GIB:.2f} GiB)",
        )
        if size.arena_bytes_per_gpu
        else ("gpu", "every routed expert fits the GPUs: ExLlamaV3's own loader")
    )
    return {
        "EXPERT_CACHE_EXPERTS": experts,
        "EXPERT_CACHE": ("1", "the GPU expert cache (--expert-cache, or the profile's EXPERT_CACHE=1)"),
        "EXPERT_CACHE_WINDOW": (
            str(size.window),
            f"resident slots that fit ({per_layer}, {size.staging} staging slots a layer beside them)",
        ),
        "EXPERT_CACHE_PINNED": (str(size.pinned), "no routing trace: plain LRU (--stats chooses a pinned share)"),
        "EXL3_MOE_CPU_SPLIT": ("0", "expert cache: every routed expert is served from the GPU's slots"),
        "CPU_MOE_OFFLOAD_LAYERS": ("0", "expert cache: every routed expert is served from the GPU's slots"),
        "EXL3_MOE_CPU_SPLIT_LAYERS": ("0", "expert cache: no CPU split"),
    }


SWAP_INTERVAL = 128
SWAP_HYSTERESIS = 2.0
SWAP_FLOOR = 8.0
SWAP_MAX = 64


def static_cpu_experts(counts: Sequence[float] | NDArray[np.float64], k: int) -> list[int]:
    """The k experts ExLlamaV3 puts on the CPU from a stats file: it orders experts hottest first (a stable
    sort on -count, `load_cpu_split`) and takes the tail, so among equal counts the higher ids go."""
    order = sorted(range(len(counts)), key=lambda e: -float(counts[e]))
    return order[len(counts) - k :]


def compare_placements(trace: RoutingTrace, k: int, learn_fraction: float = 0.5) -> PlacementComparison:
    """Static placement learned on the first part of the trace against ExLlamaV3's dynamic placement, both
    scored on the rest: the lower CPU share decodes faster (fewer selections wait on the CPU)."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    if not 0 < k < trace.experts:
        raise BadInput(f"split of {k} experts of {trace.experts}: choose 1 to {trace.experts - 1}")
    learn, score = trace.split(learn_fraction)
    counts = learn.counts()
    selections = score.steps * len(trace.layers) * trace.top_k
    static_hits = 0
    for index in range(len(trace.layers)):
        mask = np.zeros(trace.experts, dtype=bool)
        mask[static_cpu_experts(counts[index], k)] = True
        static_hits += int(mask[score.routes[:, index, :]].sum())
    # ExLlamaV3's dynamic split from the same start, its queue draining after every step (the most it can move)
    dynamic = exl3_dynamic(trace.routes, trace.experts, [k] * len(trace.layers), generation=None)
    swaps = dynamic.swaps_between(0)
    dynamic_share = (selections - dynamic.total(learn.steps)) / selections
    static_share = static_hits / selections
    uniform = k / trace.experts
    winner: Literal["static", "dynamic"] = "static" if static_share < dynamic_share - 0.005 else "dynamic"
    if winner == "static":
        verdict = (
            f"static placement puts {static_share:.1%} of selections on the CPU against the default dynamic "
            f"split's {dynamic_share:.1%} on this trace; the recommended setting also weighs drift and pays swaps"
        )
    else:
        verdict = (
            f"dynamic placement ({dynamic_share:.1%} on the CPU at its defaults) is within half a point of static "
            f"({static_share:.1%}) or better on this trace: it follows popularity as it drifts"
        )
    return PlacementComparison(
        split_experts=k,
        learn_steps=learn.steps,
        scored_steps=score.steps,
        static_cpu_share=round(static_share, 4),
        dynamic_cpu_share=round(dynamic_share, 4),
        uniform_cpu_share=round(uniform, 4),
        swaps=swaps,
        winner=winner,
        verdict=verdict,
    )


def check_counts(model: ModelFacts, counts: dict[int, Sequence[float]]) -> None:
    """Routing statistics fit the model: every layer a MoE layer, one count per routed expert."""
    moe = set(model.moe_layers)
    for layer, row in counts.items():
        if layer not in moe:
            raise BadInput(
                f"routing statistics name layer {layer}, not a MoE layer of {model.name} "
                f"({model.moe_layers[0]}-{model.moe_layers[-1]})",
                fix="collect the statistics on this model",
            )
        if len(row) != model.n_routed_experts:
            raise BadInput(
                f"routing statistics for layer {layer} have {len(row)} experts, the model {model.n_routed_experts}",
                fix="collect the statistics on this model",
            )


def split_stats(
    model: ModelFacts, counts: dict[int, Sequence[float]], key_prefix: str = "model.language_model"
) -> dict[str, list[float]]:
    """ExLlamaV3's static placement file (EXL3_MOE_CPU_SPLIT_STATS): per MoE module key (`{prefix}.layers.N.mlp`,
    as `architecture/glm5_next.py` names it), one count per expert; the loader puts the coldest in the CPU tail
    (`block_sparse_mlp_cpu.py`, load_cpu_split)."""
    stats: dict[str, list[float]] = {}
    check_counts(model, counts)
    for layer in model.moe_layers:
        layer_counts = counts.get(layer)
        if layer_counts is not None:
            stats[f"{key_prefix}.layers.{layer}.mlp"] = [float(c) for c in layer_counts]
    return stats


__all__ = [
    "CUDA_CONTEXT_BYTES",
    "Exl3GpuLedger",
    "Exl3HostLedger",
    "Exl3Offload",
    "Exl3Plan",
    "Exl3Prediction",
    "Exl3Shape",
    "PlacementComparison",
    "check_counts",
    "compare_placements",
    "counts_by_layer",
    "gpu_budget",
    "gpu_split_gib",
    "kv_bytes_per_token",
    "parse_cache_mode",
    "plan_exl3",
    "plan_exl3_for_host",
    "predict",
    "shape_from_exl3_profile",
    "split_stats",
    "static_cpu_experts",
]


def shape_from_exl3_profile(profile: object, **overrides: Any) -> Exl3Shape:
    """An Exl3Shape from a glm53.recipe.profiles.Profile (duck-typed on `value`, as shape_from_profile is)."""
    value = profile.value  # type: ignore[attr-defined]

    def integer(key: str) -> int | None:
        raw = str(value(key) or "")
        return int(raw) if raw else None

    fields: dict[str, Any] = {
        "gpus": integer("GPUS") or 1,
        "max_model_len": integer("MAX_MODEL_LEN") or Exl3Shape().max_model_len,
        "cache_size": integer("CACHE_SIZE"),
        "cache_bits": parse_cache_mode(str(value("CACHE_MODE") or "")),
        "max_num_seqs": integer("MAX_NUM_SEQS") or 1,
        "chunk_size": integer("CHUNK_SIZE") or Exl3Shape().chunk_size,
        "expert_cache": str(value("EXPERT_CACHE") or "0") == "1",
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Exl3Shape(**fields)
    except ValidationError as exc:
        raise invalid_document(exc, "the profile's ExLlamaV3 values") from exc


def counts_by_layer(stats: RoutingTrace | RoutingCounts) -> dict[int, Sequence[float]]:
    if isinstance(stats, RoutingTrace):
        matrix = stats.counts()
        return {layer: [float(c) for c in matrix[i]] for i, layer in enumerate(stats.layers)}
    return {int(layer): [float(c) for c in row] for layer, row in stats.layers.items()}


def plan_exl3_for_host(
    profile: object,
    *,
    model_dir: Path | None = None,
    root: Path = Path("/"),
    rig: Rig | None = None,
    stats_path: Path | None = None,
    stats: RoutingTrace | RoutingCounts | None = None,
    gpus: list[GpuSpec] | None = None,
    mode: ModeChoice = "auto",
    host_memory_bandwidth: float | None = None,
    shape_overrides: dict[str, Any] | None = None,
    model: ModelFacts | None = None,
) -> Exl3Plan:
    """Read the facts (this machine under `root`, or a described rig) and the files named, then plan.
    Routing statistics come read (`stats`) or from `stats_path`; `shape_overrides` go over the profile's values
    (Exl3Shape fields, None = the profile's)."""
    bandwidth = host_memory_bandwidth
    bandwidth_source = "given (--host-bandwidth)" if bandwidth else ""
    if rig is not None:
        found = gpus or [
            GpuSpec(
                index=i,
                name=gpu.name,
                total_bytes=gpu.memory_bytes,
                **({"memory_bandwidth": gpu.memory_bandwidth} if gpu.memory_bandwidth else {}),
            )
            for i, gpu in enumerate(rig.gpus)
        ]
        memory = HostMemory(
            mem_total_bytes=rig.ram_bytes,
            mem_available_bytes=None,
            cgroup_version=None,
            cgroup_limit_bytes=None,
            effective_limit_bytes=rig.ram_bytes,
        )
        topology = rig_topology(rig)
        gpu_source = f"rig {rig.name}"
        if bandwidth is None and rig.memory_bandwidth:
            bandwidth, bandwidth_source = rig.memory_bandwidth, f"rig {rig.name}: {rig.source}"
    else:
        host = host_facts.read_host_facts(root, engine_libraries=None)
        found = gpus or [gpu_spec(gpu, root) for gpu in host.gpus]
        if not found:
            raise Unavailable(
                "no NVIDIA GPU found on this machine",
                fix="plan for another machine with --rig NAME|FILE (glm53 plan host --help lists the packaged rigs)",
            )
        memory = host.require_memory()
        topology = host.require_topology()
        gpu_source = "this host"
    overrides: dict[str, Any] = {**(shape_overrides or {}), "mode": mode}
    if bandwidth:
        overrides["host_memory_bandwidth"] = bandwidth
        overrides["host_bandwidth_source"] = bandwidth_source
    shape = shape_from_exl3_profile(profile, **overrides)
    budget = host_budget(memory, shape.host_reserve_bytes)
    cpu_sets = plan_cpu_sets(topology, 1)
    pool = list(cpu_sets.pools[0]) if cpu_sets.pools else []
    if stats is None and stats_path is not None:
        stats = read_routing_stats(stats_path)
    counts = counts_by_layer(stats) if stats is not None else None
    return plan_exl3(
        model if model is not None else model_facts(model_dir),
        found,
        shape,
        host_budget=budget,
        cpu_pool=pool,
        main_cpus=list(cpu_sets.main_cpus),
        counts=counts,
        gpu_source=gpu_source,
    )
