#!/usr/bin/env python3
"""Ground truth for glm53's checkpoint code: a tiny random GLM-5.3-Flash converted to EXL3 by ExLlamaV3 itself.

Stages (each one's timing is printed; every artifact is written as soon as it exists):

1. build    a tiny random `Glm5NextForConditionalGeneration` (model_type `glm5_next`: KDA and DSA layers 3:1,
            sigmoid top-k MoE, mHC, the MTP block as layer L, a one-block vision tower) with HF transformers,
            saved as an HF checkpoint with a 512-token WordLevel tokenizer and a random calibration file.
            `--arch glm4_moe` builds a tiny `Glm4MoeForCausalLM` instead (the fallback).
2. convert  ExLlamaV3's converter (`python -m exllamav3.conversion.convert_model`), 3.0 bpw.
3. run      load the EXL3 model with ExLlamaV3 (cache of 4096 tokens: at least its 2048-token chunk) and
            generate greedily; prints load time and tokens/s (a smoke number, not a benchmark).
4. export   for the tests: the converter's config.json and quantization_config.json (when written), every
            `*.json` the converter wrote beside them, the JSON header block of each safetensors file (not the
            weights) as `<file>.header.json`, and `files.json` (names and sizes of every output file).

Needs a CUDA machine with ExLlamaV3 1.4.6 (its extension built), torch, transformers >= 5.17 and safetensors.
Stand-alone: no glm53 imports. Usage: python3 tools/make-exl3-fixture.py --work /tmp/x --export DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

VOCAB = 512


def log(msg: str) -> None:
    print(msg, flush=True)


def tiny_glm5_next_config():
    from transformers import Glm5NextConfig

    layers = 8
    text = {
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "n_shared_experts": 1,
        "n_routed_experts": 16,
        "num_experts_per_tok": 8,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512,
        "q_lora_rank": 256,
        "qk_rope_head_dim": 0,
        "qk_nope_head_dim": 256,
        "v_head_dim": 256,
        "index_topk": 256,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_kpool": 4,
        "linear_head_dim": 128,
        "linear_num_heads": 2,
        "linear_conv_kernel_dim": 4,
        "hc_mult": 4,
        "max_position_embeddings": 8192,
        "pad_token_id": VOCAB - 4,
        "eos_token_id": [VOCAB - 3, VOCAB - 2],
        "num_nextn_predict_layers": 1,
    }
    vision = {
        "model_type": "glm5_next_vision",
        "depth": 1,
        "hidden_size": 256,
        "num_heads": 2,
        "intermediate_size": 256,
        "out_hidden_size": 256,
        "projection_intermediate_size": 256,
    }
    return Glm5NextConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=VOCAB - 10,
        video_token_id=VOCAB - 9,
        image_start_token_id=VOCAB - 8,
        image_end_token_id=VOCAB - 7,
        video_start_token_id=VOCAB - 6,
        video_end_token_id=VOCAB - 5,
    )


def _unfuse_experts(sd: dict) -> dict:
    """transformers 5 keeps routed experts fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]); checkpoints (and ExLlamaV3) name them per expert. Split them the way HF's own
    conversion mapping does."""
    out = {}
    for key, t in sd.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            base = key.removesuffix("gate_up_proj")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif key.endswith("mlp.experts.down_proj") and t.dim() == 3:
            base = key.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[key] = t
    return out


def _checkpoint_names(sd: dict) -> dict:
    """transformers renames some GLM-5.3 tensors on load (its conversion mapping); save them under the
    checkpoint's own names, which ExLlamaV3 reads: `layers.N.hc_attn_fn` (not `attn_hc.fn`) and the KDA
    forget gate's tensors directly under `self_attn` (not `self_attn.forget_gate`)."""
    out = {}
    for key, t in sd.items():
        for site in ("attn", "ffn"):
            for part in ("fn", "base", "scale"):
                key = key.replace(f".{site}_hc.{part}", f".hc_{site}_{part}")
        out[key.replace(".self_attn.forget_gate.", ".self_attn.")] = t
    return out


def build_glm5_next(hf: Path) -> dict:
    import torch
    from transformers import Glm5NextForConditionalGeneration

    torch.manual_seed(0)
    config = tiny_glm5_next_config()
    model = Glm5NextForConditionalGeneration(config).to(torch.bfloat16)
    sd = _checkpoint_names(_unfuse_experts({k: v.detach().clone() for k, v in model.state_dict().items()}))
    text = config.text_config
    layers = text.num_hidden_layers
    prefix = "model.language_model.layers"
    if not any(k.startswith(f"{prefix}.{layers}.") for k in sd):
        # transformers does not instantiate the MTP block; the published checkpoint stores it as layer L,
        # DeepSeek-V3 style: a DSA attention + MoE block (no mHC) plus enorm/hnorm/eh_proj/shared_head.norm.
        src = max(n for n, t in enumerate(text.layer_types[:layers]) if t == "deepseek_sparse_attention")
        for k, v in list(sd.items()):
            if k.startswith(f"{prefix}.{src}.") and ".hc_" not in k:
                sd[k.replace(f"{prefix}.{src}.", f"{prefix}.{layers}.", 1)] = v.clone()
        h = text.hidden_size
        for name in ("enorm", "hnorm", "shared_head.norm"):
            sd[f"{prefix}.{layers}.{name}.weight"] = torch.ones(h, dtype=torch.bfloat16)
        sd[f"{prefix}.{layers}.eh_proj.weight"] = (torch.randn(h, 2 * h) * 0.02).to(torch.bfloat16)
        log(f"build: MTP block synthesised as layer {layers} (copied from DSA layer {src})")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    tc = cfg["text_config"]
    # Keys the published config.json carries in the original (Kimi-style) form, which ExLlamaV3 reads.
    tc["linear_attn_config"] = {
        "num_heads": text.linear_num_heads,
        "head_dim": text.linear_head_dim,
        "short_conv_kernel_size": text.linear_conv_kernel_dim,
        "gate_lower_bound": text.linear_lower_bound,
    }
    tc.setdefault("index_kpool_compress", True)
    tc.setdefault("mhc", True)
    tc["num_nextn_predict_layers"] = 1
    tc.setdefault("scoring_func", "sigmoid")
    tc.setdefault("topk_method", "noaux_tc")
    tc.setdefault("first_k_dense_replace", sum(1 for t in text.mlp_layer_types if t == "dense"))
    cfg["architectures"] = ["Glm5NextForConditionalGeneration"]
    cfg["torch_dtype"] = "bfloat16"
    (hf / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    pp = {
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Glm5NextImageProcessor",
        "min_image_tokens": 4,
        "max_image_tokens": 64,
    }
    (hf / "processor_config.json").write_text(json.dumps({"image_processor": pp, "video_processor": pp}, indent=2))
    return cfg


def build_glm4_moe(hf: Path) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(0)
    config = Glm4MoeConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
        n_routed_experts=16,
        num_experts_per_tok=8,
        first_k_dense_replace=1,
        max_position_embeddings=8192,
        eos_token_id=[VOCAB - 3],
        pad_token_id=VOCAB - 4,
    )
    model = Glm4MoeForCausalLM(config).to(torch.bfloat16)
    sd = _unfuse_experts({k: v.detach().clone() for k, v in model.state_dict().items()})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["Glm4MoeForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    (hf / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    return cfg


def write_tokenizer(hf: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {" ": 0, "\n": 1}
    vocab |= {f"w{i}": i for i in range(2, VOCAB - 16)}
    specials = ["<unk>", "<pad>", "<|endoftext|>", "<|user|>", "<|assistant|>", "[gMASK]", "<sop>"]
    for i, s in enumerate(specials):
        vocab[s] = VOCAB - 16 + i
    for i in range(VOCAB - 16 + len(specials), VOCAB):
        vocab[f"<|r{i}|>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<pad>"})
    )


def write_calibration(path: Path, rows: int, cols: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    save_file({"input_ids": torch.randint(2, VOCAB - 16, (rows, cols), generator=g, dtype=torch.long)}, str(path))


def export(out: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for f in sorted(out.iterdir()):
        if not f.is_file():
            continue
        files.append({"name": f.name, "size": f.stat().st_size})
        if f.suffix == ".json":
            shutil.copyfile(f, dest / f.name)
        elif f.suffix == ".safetensors":
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                raw = fh.read(n)
            json.loads(raw)  # a valid header
            (dest / f"{f.name}.header.json").write_bytes(raw)
    (dest / "files.json").write_text(json.dumps(files, indent=1) + "\n")
    log(f"export: {len(files)} files listed in {dest / 'files.json'}")


RUN_SNIPPET = r"""
import json, sys, time, torch
from exllamav3 import Config, Model, Cache, Tokenizer, Generator
from exllamav3.generator.sampler import ArgmaxSampler
d = sys.argv[1]
t0 = time.perf_counter()
config = Config.from_directory(d)
model = Model.from_config(config)
cache = Cache(model, max_num_tokens=4096)
model.load()
tokenizer = Tokenizer.from_config(config)
torch.cuda.synchronize()
t1 = time.perf_counter()
print(f"LOAD {t1 - t0:.2f} s ({type(model).__name__})", flush=True)
gen = Generator(model=model, cache=cache, tokenizer=tokenizer)
prompt = "w10 w11 w12 w13"
n = 64
gen.generate(prompt=prompt, max_new_tokens=4, sampler=ArgmaxSampler(), completion_only=True)  # warm-up
torch.cuda.synchronize()
t2 = time.perf_counter()
text = gen.generate(prompt=prompt, max_new_tokens=n, min_new_tokens=n, sampler=ArgmaxSampler(),
                    completion_only=True, stop_conditions=[])
torch.cuda.synchronize()
t3 = time.perf_counter()
ids = tokenizer.encode(text, add_bos=False).flatten().tolist()
print(f"GENERATE {n} tokens in {t3 - t2:.3f} s = {n / (t3 - t2):.1f} tokens/s (smoke number, not a benchmark)")
print("TEXT", json.dumps(text[:400]))
print("IDS", ids[:64])
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["glm5_next", "glm4_moe"], default="glm5_next")
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (created)")
    ap.add_argument("--export", type=Path, required=True, help="where the fixture files go (created)")
    ap.add_argument("--bits", type=float, default=3.0)
    ap.add_argument("--stage", choices=["all", "build"], default="all")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    hf, out, work = a.work / "hf", a.work / "exl3", a.work / "convert-work"
    for d in (hf, out, work):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t = time.perf_counter()
    cfg = build_glm5_next(hf) if a.arch == "glm5_next" else build_glm4_moe(hf)
    write_tokenizer(hf)
    write_calibration(a.work / "cal.safetensors", 16, 512)
    log(f"BUILD {a.arch} {time.perf_counter() - t:.1f} s: {cfg['architectures']} in {hf}")
    if a.stage == "build":
        return 0
    cmd = [a.python, "-m", "exllamav3.conversion.convert_model", "-i", str(hf), "-o", str(out), "-w", str(work)]
    cmd += ["-b", str(a.bits), "-cd", str(a.work / "cal.safetensors"), "-cr", "16", "-cc", "512"]
    if a.arch == "glm5_next":
        cmd += ["-vb", "16"]
    log("CONVERT " + " ".join(cmd))
    t = time.perf_counter()
    rc = subprocess.call(cmd, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    log(f"CONVERT rc={rc} {time.perf_counter() - t:.1f} s")
    if any(out.iterdir()):
        export(out, a.export)
    if rc != 0:
        return rc
    t = time.perf_counter()
    rc = subprocess.call([a.python, "-c", RUN_SNIPPET, str(out)], env=os.environ | {"PYTHONUNBUFFERED": "1"})
    log(f"RUN rc={rc} {time.perf_counter() - t:.1f} s (process, incl. imports)")
    return rc


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
