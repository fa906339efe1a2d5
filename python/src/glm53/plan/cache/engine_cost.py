"""Decode time per token as the recipe's engine pays its expert misses, step by step from a replay.

`cost_model.CostModel` prices a miss as a PCIe copy in series with the GPU's work (its prediction errs low on
purpose). The recipe's engine does more: its GPU expert cache is filled in the background while the CPU
expert pool computes what missed (EXL3_HYBRID_CPU pools, EXL3_HYBRID_LAYERS, EXL3_LRU_OVERLAP,
EXL3_HYBRID_OVERLAP_GATHER in its environment; its code is not public, so the mechanisms are read from those
names and from its summary: "CPU expert-offload pools, per-layer LRU expert cache"). Per decode step and
tensor-parallel rank (each rank holds half of every expert and does half of the work):

    step    = GPU reads outside the experts (weights less the embedding table, the KV sparse attention touches)
              + all-reduce
              + per MoE layer: the slowest of its parallel parts
    layer   = max(hits x shard / GPU expert rate,  misses x shard / miss rate + hand-off)     (misses > 0)

The miss rate is the miss path's (`MissPath`): `copy` is the old model (every miss copied, nothing overlapped,
every active expert read again by the GPU), `copy-overlap` copies beside the hits, `cpu` computes misses on
the rank's CPU pool at its share of the host's memory bandwidth, and `cpu+pcie` splits them between the
pool and the GPU reading host memory over its own PCIe link (UVA), the split balanced so both finish
together (EXL3_HYBRID_GPU_FRAC is the engine's knob for it). Layers, steps and their per-step hit counts
come from a replay (`policies.StepHits`), so the time is the mean over real steps: a step whose misses
bunch up in one layer pays for it, which an average hit rate would hide.

No efficiency is fitted to the published figures: the GPU reads at `GPU_KERNEL_EFFICIENCY` of its bandwidth
and the CPU pool at `CPU_KERNEL_EFFICIENCY` of the host's, the same assumptions as the ExLlamaV3 plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from glm53.plan.cache.decode_cost import (
    ASSUMED_HOST_TO_DEVICE,
    CPU_HANDOFF_SECONDS,
    CPU_KERNEL_EFFICIENCY,
    GPU_KERNEL_EFFICIENCY,
    TP_ALLREDUCE_SECONDS,
    build_cost_model,
)
from glm53.plan.inputs.gpus import ASSUMED_GPU_MEMORY_BANDWIDTH
from glm53.plan.inputs.kv import KvDerivation, derive_kv
from glm53.plan.inputs.model import ModelFacts, load_architecture

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from glm53.plan.cache.policies import StepHits

# Whose expert-placement policies are costed: a served engine, or the proposed cache no engine runs yet.
PolicyEngine = Literal["vllm", "exllamav3", "proposed", "exl3-cache"]
MissPath = Literal["copy", "copy-overlap", "cpu", "cpu+pcie"]
MISS_PATHS: tuple[MissPath, ...] = ("copy", "copy-overlap", "cpu", "cpu+pcie")
# What one ExLlamaV3 1.4.6 swap costs beyond moving its bytes: the checkpoint reads of its projections' tensors,
# the in-place copies into the GPU slot and the CPU worker's re-read of the demoted expert, each a Python call.
# Measured on the GPU machine (an H200 host) with the EXL3 fixture, whose experts are 39 KB, so that bytes cost
# nothing there: the slope of 34 timed sweeps' wall time over their swaps (tests/fixtures/exl3-capture, the two
# timed captures; the first sweep of each run, a warm-up, left out).
SWAP_OVERHEAD_SECONDS = 3.2e-3
# What a sweep costs before any swap (`run_pending_swap_sweeps`: every device synchronized, then each split layer's
# turn copies its map and counts to the host, walks every expert in Python and halves the counts): 11 us, plus
# 56 us and 4.2 us an expert per layer turn. Fitted to the engine's own two functions timed on the GPU machine
# over 1, 5 and 42 layers of 16, 64 and 256 experts, within 9% of every median (tools/exl3-sweep-cost.py: 47 ms
# a sweep of 42 layers of 256; 53 ms by the fit at GLM-5.3's 288); the EXL3 fixture's own sweeps without swaps,
# timed while it generated, took 0.55-1.27 ms for 5 layers of 16 (0.62 ms by the fit).
SWEEP_SECONDS = 11e-6
SWEEP_TURN_SECONDS = 56e-6
SWEEP_TURN_EXPERT_SECONDS = 4.2e-6
# The recipe's rig: 8-channel DDR4-3200 (204.8 GB/s raw), 120 GB/s effective (data/rigs/recipe-2x3090.json).
RECIPE_HOST_BANDWIDTH = 120e9
# GLM-5.3-Flash's embedding table: vocabulary 154,880 x hidden 4,096 at 2 bytes, read one row per token (the
# recipe keeps it in host memory: VLLM_GLM53_EMBED_UVA), so none of it counts as a per-token read.
EMBEDDING_BYTES = 154_880 * 4096 * 2
INDEX_TOPK = 2048


class StepCost(BaseModel):
    """The parts of a decode step on one rank, and the rates that price them."""

    model_config = ConfigDict(frozen=True)

    miss_path: MissPath
    layers: int
    top_k: int
    shard_bytes: int  # one expert's bytes on one rank
    fixed_seconds: float  # GPU reads outside the experts + all-reduce
    gpu_expert_rate: float  # bytes/s the GPU reads cached experts at
    pcie_rate: float  # host -> device bytes/s of one rank's link
    cpu_rate: float  # bytes/s one rank's CPU pool computes experts at
    handoff_seconds: float
    assumptions: list[str]
    # ExLlamaV3's dynamic split: one swap re-reads two experts and copies one; a sweep synchronizes the devices
    # and gives each split layer a turn.
    swap_seconds: float = 0.0
    sweep_seconds: float = 0.0
    turn_seconds: float = 0.0

    def layer_seconds(self, hits: NDArray[np.integer]) -> NDArray[np.float64]:
        """Seconds of each (step, layer) MoE part for its hit count."""
        import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

        hits = np.asarray(hits, dtype=np.float64)
        result: NDArray[np.float64]
        misses = self.top_k - hits
        on_gpu = hits * self.shard_bytes / self.gpu_expert_rate
        missed = misses * self.shard_bytes
        if self.miss_path == "copy":
            result = self.top_k * self.shard_bytes / self.gpu_expert_rate + missed / self.pcie_rate
        elif self.miss_path == "copy-overlap":
            result = np.maximum(on_gpu, missed / self.pcie_rate) + missed / self.gpu_expert_rate
        else:
            rate = self.cpu_rate + (self.pcie_rate if self.miss_path == "cpu+pcie" else 0.0)
            result = np.maximum(on_gpu, np.where(misses > 0, missed / rate + self.handoff_seconds, 0.0))
        return result

    def step_seconds(self, hits: NDArray[np.integer]) -> NDArray[np.float64]:
        """Seconds of each decode step from its (steps, layers) hit counts."""
        result: NDArray[np.float64] = self.fixed_seconds + self.layer_seconds(hits).sum(axis=1)
        return result

    def tokens_per_s(
        self,
        hits: NDArray[np.integer],
        swaps: int = 0,
        *,
        turns: int = 0,
        sweeps: int = 0,
        layer_share: float = 1.0,
    ) -> float:
        """Decode rate over the steps of `hits`, with `sweeps` placement sweeps paid among them, `turns` layer
        turns and `swaps` swaps in those sweeps. `layer_share`: the share of the model's MoE layers that `hits`
        (and the turns and swaps) hold, a sample standing for them all."""
        moe = float(self.layer_seconds(hits).sum()) + swaps * self.swap_seconds + turns * self.turn_seconds
        seconds = len(hits) * self.fixed_seconds + sweeps * self.sweep_seconds + moe / layer_share
        return len(hits) / seconds

    def replay_tokens_per_s(self, replayed: StepHits, start: int = 0, *, layer_share: float = 1.0) -> float:
        """`tokens_per_s` of a replay from step `start` on, with the sweeps it made there."""
        return self.tokens_per_s(
            replayed.hits[start:],
            replayed.swaps_between(start),
            turns=replayed.turns_between(start),
            sweeps=replayed.sweeps_between(start),
            layer_share=layer_share,
        )

    def layer_share(self, replayed: int, of: int) -> float:
        """The share of the model's MoE layers that `replayed` of a trace's `of` layers stand for (a trace of
        fewer layers than the model stands for all of them)."""
        return replayed / max(of, self.layers)

    def at_hit_rate(self, hit_rate: float) -> float:
        """Tokens/s when every layer of every step hits `hit_rate` of its experts (no bunching)."""
        import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

        hits = np.full((1, self.layers), hit_rate * self.top_k)
        return self.tokens_per_s(hits)


def recipe_step_cost(
    model: ModelFacts,
    kv: KvDerivation,
    miss_path: MissPath,
    *,
    tensor_parallel_size: int = 2,
    context_tokens: int = 8192,
    gpu_memory_bandwidth: float = ASSUMED_GPU_MEMORY_BANDWIDTH,
    host_memory_bandwidth: float = RECIPE_HOST_BANDWIDTH,
    host_to_device: float = ASSUMED_HOST_TO_DEVICE,
) -> StepCost:
    """The recipe's engine on its rig (vLLM tensor-parallel over `tensor_parallel_size` GPUs)."""
    tp = tensor_parallel_size
    gpu_rate = gpu_memory_bandwidth * GPU_KERNEL_EFFICIENCY
    weights = model.non_expert_bytes_per_rank(tp) - EMBEDDING_BYTES // tp
    # Sparse attention reads every indexer key of the context and the latents of its top INDEX_TOPK tokens.
    kv_read = kv.dsa_layers * (
        context_tokens * kv.indexer_key_bytes_per_layer + min(context_tokens, INDEX_TOPK) * kv.latent_bytes_per_layer
    )
    allreduce = TP_ALLREDUCE_SECONDS if tp > 1 else 0.0
    cpu_rate = host_memory_bandwidth * CPU_KERNEL_EFFICIENCY / tp
    assumptions = [
        f"GPU: {gpu_memory_bandwidth / 1e9:.1f} GB/s x {GPU_KERNEL_EFFICIENCY} (EXL3 kernels at batch size 1); "
        f"{weights / 1e9:.2f} GB of weights a rank (the embedding table read one row a token) and "
        f"{kv_read / 1e6:.0f} MB of KV at {context_tokens:,} tokens",
        f"all-reduce {allreduce * 1e3:.1f} ms a step (no P2P between GeForce cards)",
        f"host memory {host_memory_bandwidth / 1e9:.0f} GB/s x {CPU_KERNEL_EFFICIENCY} shared by {tp} CPU pools; "
        f"hand-off {CPU_HANDOFF_SECONDS * 1e6:.0f} us a layer with CPU work",
        f"PCIe {host_to_device / 1e9:.0f} GB/s a GPU (4.0 x16, pinned or mapped)",
    ]
    return StepCost(
        miss_path=miss_path,
        layers=len(model.moe_layers),
        top_k=model.num_experts_per_tok,
        shard_bytes=model.expert_bytes_per_rank(tp),
        fixed_seconds=(weights + kv_read) / gpu_rate + allreduce,
        gpu_expert_rate=gpu_rate,
        pcie_rate=host_to_device,
        cpu_rate=cpu_rate,
        handoff_seconds=CPU_HANDOFF_SECONDS,
        assumptions=assumptions,
    )


def exl3_step_cost(
    model: ModelFacts,
    *,
    context_tokens: int = 8192,
    gpu_memory_bandwidth: float = ASSUMED_GPU_MEMORY_BANDWIDTH,
    host_memory_bandwidth: float = RECIPE_HOST_BANDWIDTH,
    host_to_device: float = ASSUMED_HOST_TO_DEVICE,
    top_k: int | None = None,
) -> StepCost:
    """ExLlamaV3's CPU split, as `exl3.predict` prices it (layer split, no tensor parallelism): the CPU worker
    computes the selections on CPU-resident experts while the GPU runs its own, and a layer waits for the
    slower; a dynamic placement swap pays its measured overhead (`SWAP_OVERHEAD_SECONDS`), re-reads both experts
    from the checkpoint (page cache, at host memory speed) and copies the promoted one to the GPU, and a sweep
    pays its own measured cost (`SWEEP_*`) at the model's expert count. `top_k`: the selections a layer of the
    trace priced makes (default: the model's)."""
    gpu_rate = gpu_memory_bandwidth * GPU_KERNEL_EFFICIENCY
    weights = model.non_expert_replicated_bytes + model.non_expert_sharded_bytes - EMBEDDING_BYTES
    kv_read = len(model.dsa_layers) * context_tokens * model.index_head_dim * 2
    expert = model.expert_bytes
    swap = SWAP_OVERHEAD_SECONDS + 2 * expert / host_memory_bandwidth + expert / host_to_device
    turn = SWEEP_TURN_SECONDS + SWEEP_TURN_EXPERT_SECONDS * model.n_routed_experts
    return StepCost(
        miss_path="cpu",
        layers=len(model.moe_layers),
        top_k=model.num_experts_per_tok if top_k is None else top_k,
        shard_bytes=expert,
        fixed_seconds=(weights + kv_read) / gpu_rate,
        gpu_expert_rate=gpu_rate,
        pcie_rate=host_to_device,
        cpu_rate=host_memory_bandwidth * CPU_KERNEL_EFFICIENCY,
        handoff_seconds=CPU_HANDOFF_SECONDS,
        swap_seconds=swap,
        sweep_seconds=SWEEP_SECONDS,
        turn_seconds=turn,
        assumptions=[
            f"GPU {gpu_memory_bandwidth / 1e9:.1f} GB/s x {GPU_KERNEL_EFFICIENCY}; CPU worker at "
            f"{host_memory_bandwidth / 1e9:.0f} GB/s x {CPU_KERNEL_EFFICIENCY}; a swap {swap * 1e3:.2f} ms "
            f"({SWAP_OVERHEAD_SECONDS * 1e3:.1f} ms measured overhead, two expert reads and a copy); a sweep "
            f"{turn * 1e3:.2f} ms a split layer's turn ({model.n_routed_experts} experts, measured)"
        ],
    )


def default_exl3_cost(top_k: int) -> StepCost:
    """ExLlamaV3 serving GLM-5.3's experts on the recipe's rig, for a trace of `top_k` selections a layer."""
    return exl3_step_cost(load_architecture(), top_k=top_k)


def engine_costs(experts: int, top_k: int, *, tensor_parallel_size: int = 2) -> dict[PolicyEngine, StepCost] | None:
    """Each engine's step cost on the recipe's rig, for a trace of `experts` experts and `top_k` selections a
    layer when it routes like the published architecture (None otherwise)."""
    model = load_architecture()
    if (experts, top_k) != (model.n_routed_experts, model.num_experts_per_tok):
        return None
    kv = derive_kv(model, tensor_parallel_size)
    return {
        "vllm": recipe_step_cost(model, kv, "cpu+pcie", tensor_parallel_size=tensor_parallel_size),
        "exllamav3": exl3_step_cost(model),
    }


# The recipe's published decode rates (seed recipe, performance points: best of 2, one request, 2,048 tokens
# generated after the prompt; the prefill-256k profile).
PUBLISHED_DECODE = ((8192, 50.4), (131_072, 49.4), (260_096, 48.2))
PUBLISHED_RANGE = (47.9, 50.4)


class RecipeComparisonRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    context_tokens: int
    published: float
    predicted: dict[str, float]  # miss path -> tok/s
    today: float  # cost_model.CostModel's prediction at the same hit rate (every miss copied, no overlap)


class RecipeComparison(BaseModel):
    model_config = ConfigDict(frozen=True)

    hit_rate: float
    hit_rate_source: str
    slots_per_layer: int
    pinned_per_layer: int
    rows: list[RecipeComparisonRow]
    sensitivity: dict[str, dict[str, float]]  # hit rate -> miss path -> tok/s at 8K
    assumptions: list[str]


def compare_with_recipe(
    model: ModelFacts,
    kv: KvDerivation,
    hits: NDArray[np.integer],
    *,
    hit_rate_source: str,
    slots_per_layer: int,
    pinned_per_layer: int,
) -> RecipeComparison:
    """Prediction beside publication at the recipe's contexts, for every miss path, from a replay's
    (steps, layers) hit counts of the recipe's policy at its budget."""
    import numpy as np  # heavy: numpy loads when a computation needs it, not with glm53.plan

    hit_rate = float(np.asarray(hits).mean() / model.num_experts_per_tok)
    rows = []
    for context, published in PUBLISHED_DECODE:
        predicted = {
            path: round(recipe_step_cost(model, kv, path, context_tokens=context).tokens_per_s(hits), 1)
            for path in MISS_PATHS
        }
        today = build_cost_model(model, kv, tensor_parallel_size=2, context_tokens=context).tokens_per_s(hit_rate)
        rows.append(
            RecipeComparisonRow(context_tokens=context, published=published, predicted=predicted, today=round(today, 1))
        )
    sensitivity = {
        f"{rate:.2f}": {path: round(recipe_step_cost(model, kv, path).at_hit_rate(rate), 1) for path in MISS_PATHS}
        for rate in (0.6, 0.7, 0.8, 0.9)
    }
    cost = recipe_step_cost(model, kv, "cpu+pcie")
    return RecipeComparison(
        hit_rate=hit_rate,
        hit_rate_source=hit_rate_source,
        slots_per_layer=slots_per_layer,
        pinned_per_layer=pinned_per_layer,
        rows=rows,
        sensitivity=sensitivity,
        assumptions=cost.assumptions,
    )


__all__ = [
    "EMBEDDING_BYTES",
    "MISS_PATHS",
    "PUBLISHED_DECODE",
    "PUBLISHED_RANGE",
    "SWAP_OVERHEAD_SECONDS",
    "SWEEP_SECONDS",
    "SWEEP_TURN_EXPERT_SECONDS",
    "SWEEP_TURN_SECONDS",
    "MissPath",
    "RecipeComparison",
    "RecipeComparisonRow",
    "StepCost",
    "compare_with_recipe",
    "default_exl3_cost",
    "engine_costs",
    "exl3_step_cost",
    "recipe_step_cost",
]
