"""What the planner needs to know about the model: architecture, exact bytes per routed expert and per GPU.

Two sources, one model: the packaged data file of published facts (used when no checkpoint directory is given)
or a checkpoint directory's `config.json` plus the headers of its safetensors files (exact bytes).
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.checkpoint.safetensors_header import DTYPE_SIZES, read_safetensors_header
from glm53.errors import BadInput, invalid_document
from glm53.fsutil import parse_json, read_json

DEFAULT_ARCHITECTURE = "glm53-flash-exl3-3.05bpw"
_EXPERT_KEY = re.compile(r"^(?P<prefix>.+)\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.(?P<rest>.+)$")
_LAYER_KEY = re.compile(r"\.layers\.(?P<layer>\d+)\.")
# Column-parallel projections split their output features over the ranks, row-parallel ones their inputs.
_COLUMN_PARALLEL = ("gate_proj", "up_proj")
_ROW_PARALLEL = ("down_proj",)
# MLA down-projections are replicated in vLLM (one latent for all heads); everything else quantized is split.
_REPLICATED_PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExpertTensor(_Frozen):
    """One tensor of a routed expert, named relative to the expert (`gate_proj.trellis`)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return DTYPE_SIZES[self.dtype] * math.prod(self.shape)

    def bytes_per_rank(self, tp: int) -> int:
        """Bytes of this tensor on one of `tp` ranks.

        EXL3 shapes: trellis [in/16, out/16, 16*bits], suh [in], svh [out], mul1 a scalar."""
        if tp == 1:
            return self.nbytes
        projection, _, kind = self.name.rpartition(".")
        proj = projection.rsplit(".", 1)[-1]
        if proj in _COLUMN_PARALLEL:
            split_dim = {"trellis": 1, "svh": 0, "weight": 0}.get(kind)
        elif proj in _ROW_PARALLEL:
            split_dim = {"trellis": 0, "suh": 0, "weight": 1}.get(kind)
        else:
            split_dim = None
        if split_dim is None or len(self.shape) <= split_dim:
            return self.nbytes
        if self.shape[split_dim] % tp:
            raise BadInput(
                f"expert tensor {self.name} {list(self.shape)} cannot be split over {tp} ranks "
                f"(dimension {split_dim} is {self.shape[split_dim]})",
                fix="choose a tensor-parallel size that divides the expert's intermediate size",
            )
        return self.nbytes // tp


class KdaState(_Frozen):
    """Dimensions of the fixed per-sequence state of one KDA (linear attention) layer."""

    num_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int
    assumed: bool = False
    note: str = ""

    def recurrent_bytes(self) -> int:
        return self.num_heads * self.head_k_dim * self.head_v_dim * 4  # fp32 state

    def conv_bytes(self) -> int:
        channels = self.num_heads * (2 * self.head_k_dim + self.head_v_dim)  # q, k and v short convolutions
        return (self.conv_kernel_size - 1) * channels * 2  # bf16


class ModelFacts(_Frozen):
    name: str
    source: str
    hidden_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    n_routed_experts: int = Field(gt=0)
    num_experts_per_tok: int = Field(gt=0)
    moe_intermediate_size: int
    dsa_layers: tuple[int, ...]
    kv_lora_rank: int
    qk_rope_head_dim: int = 0
    index_n_heads: int
    index_head_dim: int
    index_kpool: int = 1
    max_position_embeddings: int
    bits: float | None = None
    kda_state: KdaState
    expert_layout: tuple[ExpertTensor, ...]
    checkpoint_bytes: int | None = None
    mtp_bytes: int = 0
    non_expert_replicated_bytes: int
    non_expert_sharded_bytes: int
    non_expert_note: str = ""

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(range(self.first_k_dense_replace, self.num_hidden_layers))

    @property
    def kda_layers(self) -> tuple[int, ...]:
        dsa = set(self.dsa_layers)
        return tuple(n for n in range(self.num_hidden_layers) if n not in dsa)

    @property
    def expert_bytes(self) -> int:
        return sum(t.nbytes for t in self.expert_layout)

    @property
    def total_experts(self) -> int:
        return len(self.moe_layers) * self.n_routed_experts

    @property
    def routed_expert_bytes(self) -> int:
        return self.total_experts * self.expert_bytes

    def expert_bytes_per_rank(self, tp: int) -> int:
        return sum(t.bytes_per_rank(tp) for t in self.expert_layout)

    def non_expert_bytes_per_rank(self, tp: int) -> int:
        return self.non_expert_replicated_bytes + -(-self.non_expert_sharded_bytes // tp)


def load_architecture(name: str = DEFAULT_ARCHITECTURE) -> ModelFacts:
    """The packaged published facts, used when no checkpoint directory is given."""
    folder = resources.files("glm53").joinpath("data/architectures")
    known = sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
    if name not in known:
        raise BadInput(f"unknown architecture {name!r}", fix=f"known: {', '.join(known)}")
    source = folder.joinpath(f"{name}.json")
    what = f"architecture data {name}"
    data = read_json(source, what=what) if isinstance(source, Path) else parse_json(source.read_bytes(), what=what)
    try:
        return ModelFacts.model_validate(data)
    except ValidationError as exc:
        raise invalid_document(exc, what, fix="reinstall glm53: its packaged data is damaged") from exc


# Layer and expert counts bound loops and sets over them: a config with 10**20 layers is refused, not iterated.
_INT_LIMITS = {"num_hidden_layers": 4096, "n_routed_experts": 32767, "first_k_dense_replace": 4096}


def _int_field(config: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInput(
            f"model config {path}: field text_config.{key} is missing or not an integer",
            fix="is this a GLM-5.3 config.json?",
        )
    limit = _INT_LIMITS.get(key, 1 << 40)
    if not 0 <= value <= limit:
        raise BadInput(f"model config {path}: field text_config.{key} = {value} is outside 0..{limit}")
    return value


def _dsa_layers(text: dict[str, Any], layers: int, path: Path) -> tuple[int, ...]:
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) >= layers:
        # The converter's config names DSA layers "deepseek_sparse_attention" (tests/fixtures/exl3).
        dsa_names = ("dsa", "deepseek_sparse_attention", "full_attention")
        return tuple(n for n, kind in enumerate(types[:layers]) if str(kind).lower() in dsa_names)
    start, interval = text.get("dsa_layer_start", 3), text.get("dsa_layer_interval", 4)
    if not isinstance(start, int) or not isinstance(interval, int) or interval <= 0:
        raise BadInput(f"model config {path}: dsa_layer_start / dsa_layer_interval must be integers")
    return tuple(range(start, layers, interval))


def _kda_state(text: dict[str, Any], default: KdaState) -> KdaState:
    linear = text.get("linear_attn_config")
    if isinstance(linear, dict) and all(isinstance(linear.get(k), int) for k in ("num_heads", "head_dim")):
        return KdaState(
            num_heads=linear["num_heads"],
            head_k_dim=linear["head_dim"],
            head_v_dim=linear["head_dim"],
            conv_kernel_size=int(linear.get("short_conv_kernel_size", 4)),
            note="config.json linear_attn_config",
        )
    return default


def _is_replicated(name: str) -> bool:
    """Non-expert tensors every rank holds in full (norms, routers, indexer weights, MLA down-projections)."""
    if any(f".{proj}." in name for proj in _REPLICATED_PROJECTIONS):
        return True
    # Quantized projections are split over the ranks, and so is the vocabulary (embedding and head).
    return not name.endswith((".trellis", ".suh", ".svh", "embed_tokens.weight", "lm_head.weight"))


def read_checkpoint_facts(model_dir: Path) -> ModelFacts:
    """Read DIR/config.json and the headers of DIR/*.safetensors; exact bytes for every routed expert."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    raw = read_json(config_path, what="model config")
    if not isinstance(raw, dict):
        raise BadInput(f"model config {config_path} is not a JSON object")
    text: dict[str, Any] = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    quant = raw.get("quantization_config") or text.get("quantization_config") or {}
    layers = _int_field(text, "num_hidden_layers", config_path)
    experts = _int_field(text, "n_routed_experts", config_path)
    first_dense = _int_field(text, "first_k_dense_replace", config_path, 0)
    default = load_architecture()

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise BadInput(f"no *.safetensors files in {model_dir}", fix="point --model-dir at the checkpoint directory")
    layouts: dict[int, dict[int, list[ExpertTensor]]] = {}
    replicated = sharded = mtp = total = 0
    for file in files:
        header = read_safetensors_header(file)
        total += header.file_size
        for name, entry in header.tensors.items():
            layer_match = _LAYER_KEY.search(name)
            if layer_match is not None and int(layer_match.group("layer")) >= layers:
                mtp += entry.nbytes  # the MTP block (stored as layer `num_hidden_layers`) is not served
                continue
            match = _EXPERT_KEY.match(name)
            if match is not None:
                tensor = ExpertTensor(name=match.group("rest"), dtype=entry.dtype, shape=entry.shape)
                by_expert = layouts.setdefault(int(match.group("layer")), {})
                by_expert.setdefault(int(match.group("expert")), []).append(tensor)
            elif _is_replicated(name):
                replicated += entry.nbytes
            else:
                sharded += entry.nbytes

    moe_layers = list(range(first_dense, layers))
    if not moe_layers or experts == 0:
        raise BadInput(
            f"model config {config_path}: no MoE layers (first_k_dense_replace {first_dense} of "
            f"{layers} layers, {experts} routed experts)",
            fix="is this a GLM-5.3 config.json?",
        )
    reference: tuple[ExpertTensor, ...] | None = None
    for layer in moe_layers:
        found = layouts.get(layer)
        if not found:
            raise BadInput(
                f"{model_dir}: MoE layer {layer} has no routed expert tensors",
                fix="the checkpoint is incomplete; verify it with `glm53 model verify`",
            )
        missing = sorted(set(range(experts)) - set(found))
        if missing:
            raise BadInput(
                f"{model_dir}: layer {layer} lacks routed experts {missing[:8]}"
                f"{' ...' if len(missing) > 8 else ''} of {experts}",
                fix="the checkpoint is incomplete; verify it with `glm53 model verify`",
            )
        for expert, tensors in sorted(found.items()):
            layout = tuple(sorted(tensors, key=lambda t: t.name))
            if reference is None:
                reference = layout
            elif layout != reference:
                raise BadInput(
                    f"{model_dir}: expert {expert} of layer {layer} is laid out differently "
                    "from the other routed experts",
                    fix="the planner needs one size per expert slot; re-quantize the experts uniformly",
                )
    assert reference is not None
    bits = quant.get("bits") if isinstance(quant, dict) else None
    try:
        return ModelFacts(
            name=str(raw.get("model_type", "unknown")),
            source=f"checkpoint {model_dir} (config.json and {len(files)} safetensors headers)",
            hidden_size=_int_field(text, "hidden_size", config_path),
            num_hidden_layers=layers,
            first_k_dense_replace=first_dense,
            n_routed_experts=experts,
            num_experts_per_tok=_int_field(text, "num_experts_per_tok", config_path),
            moe_intermediate_size=_int_field(text, "moe_intermediate_size", config_path),
            dsa_layers=_dsa_layers(text, layers, config_path),
            kv_lora_rank=_int_field(text, "kv_lora_rank", config_path),
            qk_rope_head_dim=_int_field(text, "qk_rope_head_dim", config_path, 0),
            index_n_heads=_int_field(text, "index_n_heads", config_path),
            index_head_dim=_int_field(text, "index_head_dim", config_path),
            index_kpool=_int_field(text, "index_kpool", config_path, 1),
            max_position_embeddings=_int_field(text, "max_position_embeddings", config_path),
            bits=float(bits) if isinstance(bits, int | float) else None,
            kda_state=_kda_state(text, default.kda_state),
            expert_layout=reference,
            checkpoint_bytes=total,
            mtp_bytes=mtp,
            non_expert_replicated_bytes=replicated,
            non_expert_sharded_bytes=sharded,
            non_expert_note="from the safetensors headers: norms, routers, indexer weights and MLA "
            "down-projections replicated; other quantized projections and the vocabulary split",
        )
    except ValidationError as exc:
        raise invalid_document(exc, f"model config {config_path}") from exc


def model_facts(model_dir: Path | None) -> ModelFacts:
    return load_architecture() if model_dir is None else read_checkpoint_facts(model_dir)


__all__ = [
    "DEFAULT_ARCHITECTURE",
    "ExpertTensor",
    "KdaState",
    "ModelFacts",
    "load_architecture",
    "model_facts",
    "read_checkpoint_facts",
]
