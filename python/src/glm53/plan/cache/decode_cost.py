"""Predicted decode speed: GPU time per token plus the routed experts that miss the GPU cache, moved over
PCIe.

    seconds per token = gpu_seconds
                        + (1 - hit rate) x top_k x MoE layers x expert bytes per GPU / host->device bytes/s

The GPU part reads, once per token, the weights each GPU holds outside the expert cache, the active experts
and the KV entries sparse attention touches, at the GPU's memory bandwidth, plus the per-step all-reduce cost
of tensor parallelism without peer-to-peer (about 2.5 ms on two GeForce cards). Copies and compute are not
assumed to overlap, so the prediction errs low. The bandwidth is measured (`glm53 probe`, `--bandwidth FILE`)
or an assumption that says so.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import read_json
from glm53.host.probe import PROBE_FORMAT, MemoryKind, ProbeReport
from glm53.plan.inputs.gpus import ASSUMED_GPU_MEMORY_BANDWIDTH
from glm53.plan.inputs.kv import KvDerivation
from glm53.plan.inputs.model import ModelFacts

# A PCIe 4.0 x16 link moves about 24-26 GB/s host->device from pinned memory in practice (31.5 GB/s raw).
ASSUMED_HOST_TO_DEVICE = 24.0e9
TP_ALLREDUCE_SECONDS = 2.5e-3  # per decode step with custom all-reduce off (no P2P on GeForce)
# The EXL3 kernels' rates, shared by the ExLlamaV3 plan (glm53.plan.exllamav3.split) and the engines' step costs
# (glm53.plan.cache.engine_cost).
# Effective rate of ExLlamaV3's CPU mul1 kernels over the expert bytes they read, as a share of the host's
# memory bandwidth: trellis decoding is arithmetic-heavy, so they do not stream at the bus rate.
CPU_KERNEL_EFFICIENCY = 0.5
# Effective share of the GPU's memory bandwidth EXL3 decode kernels reach at batch size 1.
GPU_KERNEL_EFFICIENCY = 0.6
# Submitting a layer's job to the worker and collecting it (stream memops and a shared-memory ring): ~60 us.
CPU_HANDOFF_SECONDS = 60e-6


class Bandwidth(BaseModel):
    model_config = ConfigDict(frozen=True)

    bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    source: str


def assumed_bandwidth() -> Bandwidth:
    return Bandwidth(
        bytes_per_s=ASSUMED_HOST_TO_DEVICE,
        source="assumed: 24 GB/s, a PCIe 4.0 x16 pinned copy; measure with `glm53 probe`",
    )


def read_probe_bandwidth(path: Path, kind: MemoryKind = "pinned", *, flag: str = "--bandwidth") -> Bandwidth:
    """The host->device rate of one memory kind from a `glm53 probe --json` file (given as `flag`)."""
    raw = read_json(path, what=f"{flag}: probe report")
    try:
        report = ProbeReport.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(
            exc, f"{flag}: probe report {path}", fix="write it with `glm53 probe --json > FILE`"
        ) from exc
    if report.format != PROBE_FORMAT:
        raise BadInput(f"{flag}: probe report {path}: format {report.format!r} is not {PROBE_FORMAT!r}")
    rates = [r for r in report.results if r.kind == kind]
    if not rates:
        raise BadInput(
            f"{flag}: probe report {path} has no {kind} measurement",
            fix=f"it has: {', '.join(sorted({r.kind for r in report.results})) or 'none'}",
        )
    best = max(rates, key=lambda r: r.block_bytes)
    return Bandwidth(
        bytes_per_s=best.bytes_per_s,
        source=f"measured: {path} ({kind}, {best.block_bytes:,}-B blocks on {report.device})",
    )


class CostModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    expert_bytes_per_gpu: int
    expert_lookups_per_token: int  # top_k x MoE layers
    host_to_device: Bandwidth
    gpu_seconds_per_token: float
    gpu_note: str

    def seconds_per_token(self, hit_rate: float) -> float:
        moved = (1.0 - hit_rate) * self.expert_lookups_per_token * self.expert_bytes_per_gpu
        return self.gpu_seconds_per_token + moved / self.host_to_device.bytes_per_s

    def tokens_per_s(self, hit_rate: float) -> float:
        return 1.0 / self.seconds_per_token(hit_rate)

    def pcie_bytes_per_token(self, hit_rate: float) -> float:
        return (1.0 - hit_rate) * self.expert_lookups_per_token * self.expert_bytes_per_gpu


def build_cost_model(
    model: ModelFacts,
    kv: KvDerivation,
    *,
    tensor_parallel_size: int,
    bandwidth: Bandwidth | None = None,
    context_tokens: int = 8192,
    gpu_memory_bandwidth: float = ASSUMED_GPU_MEMORY_BANDWIDTH,
    index_topk: int = 2048,
) -> CostModel:
    tp = tensor_parallel_size
    lookups = model.num_experts_per_tok * len(model.moe_layers)
    expert = model.expert_bytes_per_rank(tp)
    weights = model.non_expert_bytes_per_rank(tp) + lookups * expert
    # Sparse attention reads every indexer key of the context and the latents of the top index_topk tokens.
    kv_read = kv.dsa_layers * (
        context_tokens * kv.indexer_key_bytes_per_layer + min(context_tokens, index_topk) * kv.latent_bytes_per_layer
    )
    allreduce = TP_ALLREDUCE_SECONDS if tp > 1 else 0.0
    gpu_seconds = (weights + kv_read) / gpu_memory_bandwidth + allreduce
    note = (
        f"{weights + kv_read:,} B read per token per GPU at {gpu_memory_bandwidth / 1e9:.1f} GB/s"
        f" (context {context_tokens:,})" + (f" + {allreduce * 1e3:.1f} ms all-reduce" if allreduce else "")
    )
    return CostModel(
        expert_bytes_per_gpu=expert,
        expert_lookups_per_token=lookups,
        host_to_device=bandwidth or assumed_bandwidth(),
        gpu_seconds_per_token=gpu_seconds,
        gpu_note=note,
    )


__all__ = [
    "ASSUMED_HOST_TO_DEVICE",
    "Bandwidth",
    "CostModel",
    "assumed_bandwidth",
    "build_cost_model",
    "read_probe_bandwidth",
]
