"""A tiny checkpoint laid out like turboderp's GLM-5.3-Flash EXL3 one, with real safetensors files.

The layout follows the real checkpoint at a tiny scale:
- trunk layers 0..L-1 under `model.language_model.layers.N.`; the first `first_k_dense_replace` are dense,
  the others MoE with routed experts stored as EXL3 tensors (`.trellis` int16, `.suh`/`.svh` fp16,
  `.mul1` an int32 scalar);
- DSA (sparse-attention) layers every 4th layer starting at 3, the others KDA linear attention;
- `kpool_aux.safetensors`: the `index_kpool_compress_gate` / `_ape` pair of every DSA layer;
- `mtp.safetensors`: the MTP block stored as layer L;
- a stock `model.safetensors.index.json` that, like the upstream one, lists only the shards.

Files are written byte by byte in the safetensors format (8-byte little-endian header length, JSON header
padded with spaces to 8 bytes, data section) so that dtypes numpy lacks (BF16) can be used; the
`safetensors` library reads them back in the tests.

Checked against a real ExLlamaV3 1.4.6 conversion (tests/fixtures/exl3, docs/checkpoint.md "Ground truth"): the
routed experts' names, dtypes and shapes are the converter's. Kept different on purpose, because this fixture
models the *published* checkpoint that install/lock/verify must handle, or because the code under test does not
read them: `kpool_aux.safetensors`, `mtp.safetensors` and the shards-only index (the converter itself writes all
of it into the shards); KDA `q/k/v_proj` (converter: one `qkv_proj`) and `g_proj` (converter: `g_a/g_b_proj`
F16, `f_a/f_b_proj`, `conv1d`, `dt_bias`); BF16 where the converter stores F16 (router, indexer `wk`,
`weights_proj`, `k_norm`, kpool gate) or F32 (kpool ape); `kv_b_proj` and `lm_head` (converter: F16 and 6-bit
EXL3); no mHC tensors; `layer_types` `kda`/`dsa` (converter's config: `linear_attention`/
`deepseek_sparse_attention`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I16": 2, "I32": 4, "U8": 1, "I8": 1}
PREFIX = "model.language_model"


@dataclass
class TinySpec:
    """The tiny model's shape; the defaults give a checkpoint of a few hundred KiB."""

    layers: int = 8
    experts: int = 8
    experts_per_token: int = 2
    hidden: int = 64
    moe_intermediate: int = 32
    dense_intermediate: int = 96
    first_k_dense: int = 3
    bits: int = 3
    heads: int = 4
    kv_lora_rank: int = 32
    q_lora_rank: int = 48
    head_dim: int = 16
    index_heads: int = 2
    index_head_dim: int = 16
    index_kpool: int = 4
    index_topk: int = 64
    vocab: int = 256
    shards: int = 3
    dsa_first: int = 3
    dsa_every: int = 4
    seed: int = 0

    @property
    def dsa_layers(self) -> list[int]:
        return [n for n in range(self.layers) if n >= self.dsa_first and (n - self.dsa_first) % self.dsa_every == 0]


@dataclass
class _Tensor:
    dtype: str
    shape: tuple[int, ...]


@dataclass
class _File:
    tensors: dict[str, _Tensor] = field(default_factory=dict)


def exl3_linear(name: str, in_features: int, out_features: int, bits: int) -> dict[str, _Tensor]:
    """The four tensors of one EXL3-quantized linear layer."""
    return {
        f"{name}.trellis": _Tensor("I16", (in_features // 16, out_features // 16, 16 * bits)),
        f"{name}.suh": _Tensor("F16", (in_features,)),
        f"{name}.svh": _Tensor("F16", (out_features,)),
        f"{name}.mul1": _Tensor("I32", ()),
    }


def _attention(spec: TinySpec, layer: int, *, dsa: bool) -> dict[str, _Tensor]:
    base = f"{PREFIX}.layers.{layer}.self_attn"
    h, b = spec.hidden, spec.bits
    out: dict[str, _Tensor] = {}
    if dsa:
        qk = spec.heads * spec.head_dim
        out |= exl3_linear(f"{base}.q_a_proj", h, spec.q_lora_rank, b)
        out[f"{base}.q_a_layernorm.weight"] = _Tensor("BF16", (spec.q_lora_rank,))
        out |= exl3_linear(f"{base}.q_b_proj", spec.q_lora_rank, qk, b)
        out |= exl3_linear(f"{base}.kv_a_proj_with_mqa", h, spec.kv_lora_rank, b)
        out[f"{base}.kv_a_layernorm.weight"] = _Tensor("BF16", (spec.kv_lora_rank,))
        out |= exl3_linear(f"{base}.kv_b_proj", spec.kv_lora_rank, 2 * qk, b)
        out |= exl3_linear(f"{base}.o_proj", qk, h, b)
        idx = f"{base}.indexer"
        out[f"{idx}.wq_b.weight"] = _Tensor("BF16", (spec.index_heads * spec.index_head_dim, spec.q_lora_rank))
        out[f"{idx}.wk.weight"] = _Tensor("BF16", (spec.index_head_dim, h))
        out[f"{idx}.weights_proj.weight"] = _Tensor("BF16", (spec.index_heads, h))
        out[f"{idx}.k_norm.weight"] = _Tensor("BF16", (spec.index_head_dim,))
        out[f"{idx}.k_norm.bias"] = _Tensor("BF16", (spec.index_head_dim,))
    else:
        qk = spec.heads * spec.head_dim
        for proj in ("q_proj", "k_proj", "v_proj"):
            out |= exl3_linear(f"{base}.{proj}", h, qk, b)
        out |= exl3_linear(f"{base}.o_proj", qk, h, b)
        out[f"{base}.g_proj.weight"] = _Tensor("BF16", (spec.heads, h))
        out[f"{base}.A_log"] = _Tensor("F32", (spec.heads,))
    return out


def kpool_tensors(spec: TinySpec, layer: int) -> dict[str, _Tensor]:
    idx = f"{PREFIX}.layers.{layer}.self_attn.indexer"
    return {
        f"{idx}.index_kpool_compress_gate": _Tensor("BF16", (spec.index_head_dim, spec.hidden)),
        f"{idx}.index_kpool_compress_ape": _Tensor("BF16", (spec.index_kpool, spec.index_head_dim)),
    }


def _mlp(spec: TinySpec, layer: int) -> dict[str, _Tensor]:
    base = f"{PREFIX}.layers.{layer}.mlp"
    h, b = spec.hidden, spec.bits
    out: dict[str, _Tensor] = {}
    if layer < spec.first_k_dense:
        out |= exl3_linear(f"{base}.gate_proj", h, spec.dense_intermediate, b)
        out |= exl3_linear(f"{base}.up_proj", h, spec.dense_intermediate, b)
        out |= exl3_linear(f"{base}.down_proj", spec.dense_intermediate, h, b)
        return out
    out[f"{base}.gate.weight"] = _Tensor("BF16", (spec.experts, h))
    out[f"{base}.gate.e_score_correction_bias"] = _Tensor("F32", (spec.experts,))
    for proj, (i, o) in {
        "gate_proj": (h, spec.moe_intermediate),
        "up_proj": (h, spec.moe_intermediate),
        "down_proj": (spec.moe_intermediate, h),
    }.items():
        out |= exl3_linear(f"{base}.shared_experts.{proj}", i, o, b)
    for expert in range(spec.experts):
        out |= exl3_linear(f"{base}.experts.{expert}.gate_proj", h, spec.moe_intermediate, b)
        out |= exl3_linear(f"{base}.experts.{expert}.up_proj", h, spec.moe_intermediate, b)
        out |= exl3_linear(f"{base}.experts.{expert}.down_proj", spec.moe_intermediate, h, b)
    return out


def _layer(spec: TinySpec, layer: int) -> dict[str, _Tensor]:
    base = f"{PREFIX}.layers.{layer}"
    out = {
        f"{base}.input_layernorm.weight": _Tensor("BF16", (spec.hidden,)),
        f"{base}.post_attention_layernorm.weight": _Tensor("BF16", (spec.hidden,)),
    }
    out |= _attention(spec, layer, dsa=layer in spec.dsa_layers)
    out |= _mlp(spec, layer)
    return out


def _mtp_layer(spec: TinySpec) -> dict[str, _Tensor]:
    n = spec.layers
    base = f"{PREFIX}.layers.{n}"
    out = {
        f"{base}.input_layernorm.weight": _Tensor("BF16", (spec.hidden,)),
        f"{base}.post_attention_layernorm.weight": _Tensor("BF16", (spec.hidden,)),
        f"{base}.enorm.weight": _Tensor("BF16", (spec.hidden,)),
        f"{base}.hnorm.weight": _Tensor("BF16", (spec.hidden,)),
        f"{base}.eh_proj.weight": _Tensor("BF16", (spec.hidden, 2 * spec.hidden)),
        f"{base}.shared_head.norm.weight": _Tensor("BF16", (spec.hidden,)),
    }
    out |= _attention(spec, n, dsa=True)
    # The MTP block is DSA + MoE: its kpool pair lives in mtp.safetensors with the rest of the block.
    out |= kpool_tensors(spec, n)
    moe = TinySpec(**{**spec.__dict__, "first_k_dense": 0})
    out |= _mlp(moe, n)
    return out


def _config(spec: TinySpec) -> dict[str, object]:
    dsa = set(spec.dsa_layers)
    text_config = {
        "model_type": "glm5_next_text",
        "architectures": ["Glm5NextForCausalLM"],
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": spec.heads,
        "qk_nope_head_dim": spec.head_dim,
        "qk_rope_head_dim": 0,
        "v_head_dim": spec.head_dim,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "index_n_heads": spec.index_heads,
        "index_head_dim": spec.index_head_dim,
        "index_topk": spec.index_topk,
        "index_kpool": spec.index_kpool,
        "layer_types": ["dsa" if n in dsa else "kda" for n in range(spec.layers)],
        "dsa_layer_start": spec.dsa_first,
        "dsa_layer_interval": spec.dsa_every,
        "n_routed_experts": spec.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_intermediate_size": spec.moe_intermediate,
        "intermediate_size": spec.dense_intermediate,
        "first_k_dense_replace": spec.first_k_dense,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "max_position_embeddings": 4096,
        "vocab_size": spec.vocab,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "eos_token_id": [spec.vocab - 3, spec.vocab - 2, spec.vocab - 1],
    }
    return {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text_config,
        "quantization_config": {
            "quant_method": "exl3",
            "version": "1.4.6",
            "bits": float(spec.bits),
            "head_bits": 6,
            "calibration": {"rows": 250, "cols": 2048},
            "codebook": "mul1",
        },
        "torch_dtype": "bfloat16",
    }


def write_safetensors(path: Path, tensors: dict[str, _Tensor], rng: np.random.Generator) -> int:
    """Write one safetensors file with random payload bytes; returns the data-section size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = DTYPE_SIZES[tensor.dtype] * int(np.prod(tensor.shape, dtype=np.int64))
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    payload = rng.integers(0, 256, size=offset, dtype=np.uint8).tobytes()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)
    return offset


def write_tiny_glm53_checkpoint(
    root: Path,
    *,
    experts: int = 8,
    layers: int = 8,
    shards: int = 3,
    hidden: int = 64,
    moe_intermediate: int = 32,
    bits: int = 3,
    seed: int = 0,
    with_kpool: bool = True,
    with_mtp: bool = True,
) -> Path:
    """Write the tiny checkpoint into `root` (created if needed) and return `root`.

    Shards: `model-0000K-of-0000S.safetensors`; aux files `kpool_aux.safetensors` and `mtp.safetensors`;
    `config.json`; `model.safetensors.index.json` listing only the shards (as upstream does).
    """
    spec = TinySpec(
        layers=layers,
        experts=experts,
        shards=shards,
        hidden=hidden,
        moe_intermediate=moe_intermediate,
        bits=bits,
        seed=seed,
    )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    trunk: dict[str, _Tensor] = {f"{PREFIX}.embed_tokens.weight": _Tensor("BF16", (spec.vocab, spec.hidden))}
    per_layer = [_layer(spec, n) for n in range(spec.layers)]
    tail = {
        f"{PREFIX}.norm.weight": _Tensor("BF16", (spec.hidden,)),
        "lm_head.weight": _Tensor("BF16", (spec.vocab, spec.hidden)),
    }
    # Spread whole layers over the shards, embeddings in the first, head in the last.
    files = [_File() for _ in range(shards)]
    files[0].tensors |= trunk
    for n, tensors in enumerate(per_layer):
        files[min(n * shards // spec.layers, shards - 1)].tensors |= tensors
    files[-1].tensors |= tail

    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(files, start=1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(root / name, shard.tensors, rng)
        weight_map |= dict.fromkeys(shard.tensors, name)

    if with_kpool:
        kpool: dict[str, _Tensor] = {}
        for n in spec.dsa_layers:
            kpool |= kpool_tensors(spec, n)
        write_safetensors(root / "kpool_aux.safetensors", kpool, rng)
    if with_mtp:
        write_safetensors(root / "mtp.safetensors", _mtp_layer(spec), rng)

    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (root / "config.json").write_text(json.dumps(_config(spec), indent=2) + "\n")
    return root


__all__ = ["TinySpec", "exl3_linear", "kpool_tensors", "write_safetensors", "write_tiny_glm53_checkpoint"]
