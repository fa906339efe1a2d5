"""Serving profiles: the recipe's own keys, their defaults from package data files, and each value's origin.

A profile file is a shell fragment of `: "${KEY:=default}"` lines, exactly what the recipe's entrypoint
sources, so bash reads it the same way (a test checks that). Values are layered, lowest first:

    profile file  <  host plan  <  --env-file (a recipe .env)  <  process environment  <  --set KEY=VALUE

The host plan (`glm53 plan host --env`) fills the keys it computes (CPU_OFFLOAD_GB, KV_CACHE_MEMORY_BYTES, the
expert cache and CPU pool keys) over the profile's defaults, as the recipe's entrypoint exports the planner's
output after sourcing the profile.

Only the keys below exist; a key that is not one of them, in a file or in `--set`, is an error that lists the
close matches. Unknown variables in the process environment are ignored (it holds many unrelated ones).
Every value is checked against its key's kind (int, float, bool, json, ...) and remembers its origin.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.fsutil import parse_json, read_text_bounded
from glm53.recipe.engine import ENGINES, Engine, engine_named
from glm53.safetext import printable

Kind = Literal["str", "int", "float", "bool", "json", "path"]
# flag: a vLLM command-line flag; env: exported to the engine's environment; config: a field of the engine's
# own config file (TabbyAPI's config.yml); meta: read by glm53 itself (which engine serves the profile).
Role = Literal["flag", "env", "config", "meta"]
Origin = Literal["profile", "plan", "env-file", "env", "set"]

PROFILES_RESOURCE = "data/profiles"
# The packaged profiles are the .env files of data/profiles: adding a file adds a profile everywhere.
PROFILE_NAMES = tuple(
    sorted(
        entry.name.removesuffix(".env")
        for entry in resources.files("glm53").joinpath(PROFILES_RESOURCE).iterdir()
        if entry.name.endswith(".env")
    )
)
DEFAULT_PROFILE = "agent-256k"
ENV_FILE_MAX_BYTES = 1 << 20
BUILTIN_CHAT_TEMPLATE = "builtin:bounded"


# How a flag key reaches the argv: "value" --flag VALUE; "bool" 1 -> --flag, 0 -> --no-flag; "template" the
# chat template's path (BUILTIN_CHAT_TEMPLATE = the packaged one); "compilation" a field of one JSON flag.
FlagStyle = Literal["value", "bool", "template", "compilation"]


@dataclass(frozen=True)
class KeySpec:
    key: str
    kind: Kind
    role: Role
    doc: str
    recipe: bool = True  # one of the recipe's 76 keys (config.runtime.env), or added by glm53
    flag: str | None = None  # the vLLM flag of a flag key
    style: FlagStyle = "value"
    # Inclusive range of an int or float key; every number must also be finite.
    bounds: tuple[float, float] = (0, 2**62)
    # The engines that read this key; a profile may set only its own engine's keys.
    engines: tuple[Engine, ...] = ("vllm",)
    # The field of the engine's config file a config key renders to ("model.max_seq_len").
    config: str | None = None
    # The only values a str key takes (None: any string).
    choices: tuple[str, ...] | None = None
    # A str key holding a comma-separated list of numbers (GPU_SPLIT, AUTOSPLIT_RESERVE).
    number_list: bool = False
    # A regular expression a str value must match in full, with its human form (None: any string).
    pattern: tuple[str, str] | None = None


_DEFAULT_BOUNDS = KeySpec.bounds
_INT31 = 2**31 - 1


def _env(
    key: str,
    doc: str,
    kind: Kind = "str",
    *,
    recipe: bool = True,
    bounds: tuple[float, float] = _DEFAULT_BOUNDS,
    engines: tuple[Engine, ...] = ("vllm",),
    choices: tuple[str, ...] | None = None,
) -> KeySpec:
    return KeySpec(key, kind, "env", doc, recipe, bounds=bounds, engines=engines, choices=choices)


_EXL3: tuple[Engine, ...] = ("exllamav3",)
_BOTH: tuple[Engine, ...] = ENGINES


def _tabby(
    key: str,
    kind: Kind,
    field: str,
    doc: str,
    *,
    bounds: tuple[float, float] = _DEFAULT_BOUNDS,
    choices: tuple[str, ...] | None = None,
    number_list: bool = False,
    pattern: tuple[str, str] | None = None,
) -> KeySpec:
    """A field of TabbyAPI's config.yml (common/config_models.py at the pinned commit names them)."""
    return KeySpec(
        key,
        kind,
        "config",
        doc,
        recipe=False,
        bounds=bounds,
        engines=_EXL3,
        config=field,
        choices=choices,
        number_list=number_list,
        pattern=pattern,
    )


def _flag(
    key: str,
    kind: Kind,
    flag: str,
    doc: str,
    *,
    recipe: bool = True,
    style: FlagStyle | None = None,
    bounds: tuple[float, float] = _DEFAULT_BOUNDS,
    engines: tuple[Engine, ...] = ("vllm",),
    config: str | None = None,
) -> KeySpec:
    return KeySpec(
        key,
        kind,
        "flag",
        doc,
        recipe,
        flag,
        style or ("bool" if kind == "bool" else "value"),
        bounds,
        engines=engines,
        config=config,
    )


# The flag keys, in the argv order of the recipe's `config.launch` (the server's --host and --port, which are
# not profile keys, follow SERVED_MODEL_NAME); then the keys exported to the engine's environment.
_SPECS: tuple[KeySpec, ...] = (
    _flag("SERVED_MODEL_NAME", "str", "--served-model-name", "the model id clients send"),
    _flag("TENSOR_PARALLEL_SIZE", "int", "--tensor-parallel-size", "GPUs the model is split over", bounds=(1, 64)),
    _flag("DISTRIBUTED_EXECUTOR_BACKEND", "str", "--distributed-executor-backend", "mp or ray", recipe=False),
    _flag("MODEL_IMPL", "str", "--model-impl", "vllm or transformers", recipe=False),
    _flag("QUANTIZATION", "str", "--quantization", "exl3 needs the GLM-5.3 overlay", recipe=False),
    _flag("DTYPE", "str", "--dtype", "activation dtype", recipe=False),
    _flag(
        "MAX_MODEL_LEN",
        "int",
        "--max-model-len",
        "context window in tokens (exllamav3: TabbyAPI's model.max_seq_len)",
        bounds=(1, _INT31),
        engines=_BOTH,
        config="model.max_seq_len",
    ),
    _flag(
        "MAX_NUM_SEQS",
        "int",
        "--max-num-seqs",
        "concurrent sequences (exllamav3: TabbyAPI's model.max_batch_size)",
        bounds=(1, 65536),
        engines=_BOTH,
        config="model.max_batch_size",
    ),
    _flag(
        "MAX_NUM_BATCHED_TOKENS",
        "int",
        "--max-num-batched-tokens",
        "tokens per scheduler step (prefill chunk)",
        bounds=(1, _INT31),
    ),
    _flag("CHUNKED_PREFILL", "bool", "--enable-chunked-prefill", "chunked prefill (1) or not (0)", recipe=False),
    _flag(
        "GPU_MEMORY_UTILIZATION", "float", "--gpu-memory-utilization", "fraction of VRAM vLLM may use", bounds=(0.01, 1)
    ),
    _flag(
        "KV_CACHE_MEMORY_BYTES", "int", "--kv-cache-memory-bytes", "KV cache size per GPU, in bytes", bounds=(1, 2**50)
    ),
    _flag(
        "KV_CACHE_DTYPE",
        "str",
        "--kv-cache-dtype",
        "auto = bf16; quantized MLA KV breaks past ~2K tokens",
        recipe=False,
    ),
    _flag("OFFLOAD_BACKEND", "str", "--offload-backend", "auto | prefetch | uva", recipe=False),
    _flag("CPU_OFFLOAD_GB", "int", "--cpu-offload-gb", "GiB of weights kept in host memory", bounds=(0, 65536)),
    _flag("CPU_OFFLOAD_PARAMS", "str", "--cpu-offload-params", "which parameters are offloaded", recipe=False),
    _flag(
        "COMPILATION_MODE",
        "int",
        "--compilation-config",
        "its mode (0 = no torch.compile)",
        recipe=False,
        style="compilation",
        bounds=(0, 3),
    ),
    _flag("CUDA_GRAPH_MODE", "str", "--compilation-config", "its cudagraph_mode", style="compilation"),
    _flag("PREFIX_CACHING", "bool", "--enable-prefix-caching", "prefix caching (1) or not (0)"),
    _flag(
        "CHAT_TEMPLATE",
        "path",
        "--chat-template",
        f"a file, or {BUILTIN_CHAT_TEMPLATE} for the packaged one",
        style="template",
    ),
    _flag("REASONING_CONFIG", "json", "--reasoning-config", "reasoning start/end strings (end = forced at budget)"),
    _flag("FLASHINFER_AUTOTUNE", "bool", "--enable-flashinfer-autotune", "FlashInfer autotuning", recipe=False),
    _flag("LANGUAGE_MODEL_ONLY", "bool", "--language-model-only", "skip the multimodal tower", recipe=False),
    _flag("SKIP_MM_PROFILING", "bool", "--skip-mm-profiling", "skip multimodal memory profiling", recipe=False),
    _flag("TOOL_CALL_PARSER", "str", "--tool-call-parser", "parser of the model's tool calls", recipe=False),
    _flag("AUTO_TOOL_CHOICE", "bool", "--enable-auto-tool-choice", "tool_choice=auto", recipe=False),
    _flag("REASONING_PARSER", "str", "--reasoning-parser", "parser of the model's reasoning", recipe=False),
    _flag("ENFORCE_EAGER", "bool", "--enforce-eager", "no graph capture or compile (fast start)", recipe=False),
    # The recipe's engine environment (ExLlamaV3 expert cache and kernels, GLM-5.3 overlay switches). The
    # recipe names these keys without their values; where neither it nor the planner defines a format, the key
    # takes any string (a recipe .env must load unchanged) and its meaning here is read from its name.
    _env("EXL3_DYNAMIC_LRU", "per-layer LRU cache of routed experts on the GPU"),
    _env("EXL3_DYNAMIC_LRU_MAX_LAYER_ID", "last layer that gets an LRU expert cache"),
    _env("EXL3_DYNAMIC_LRU_MAX_TOKENS", "batch size above which the LRU path is bypassed"),
    _env("EXL3_LRU_CAPACITY_PLAN", "LAYER:SLOTS:PINNED per MoE layer, comma-separated (planner output)"),
    _env("EXL3_VMM_HOT_RANKINGS", "hot-expert rankings file: {layer: [expert ids, hottest first]}", "path"),
    _env("EXL3_VMM_HOT_EXPERTS", "GPU slots per layer for hot experts"),
    _env(
        "EXL3_PINNED_FRAC",
        "pinned share of the GPU expert slots (planner output; the recipe used 0.2)",
        "float",
        bounds=(0, 1),
    ),
    _env("VLLM_UVA_OFFLOAD_EXACT_HOST_REGISTER", "register exactly the offloaded host pages for UVA"),
    _env("EXL3_LRU_GATHER_IMPL", "kernel that gathers missed experts into cache slots"),
    _env("EXL3_LRU_GATHER_BLOCK", "gather kernel block size"),
    _env("EXL3_LRU_GATHER_WARPS", "gather kernel warps"),
    _env("EXL3_LRU_FUSED_GATHER", "fuse the gather into the MoE launch"),
    _env("EXL3_LRU_OVERLAP", "overlap expert copies with compute"),
    _env("EXL3_LRU_COPY_STREAM_PRIORITY", "CUDA stream priority of expert copies"),
    _env("EXL3_LRU_HYBRID_PREFILL", "prefill uses GPU-cached and host experts together"),
    _env("EXL3_LRU_SLRU_PROTECTED_PCT", "segmented-LRU protected share, percent"),
    _env("EXL3_LRU_LOG_EVERY", "log cache statistics every N steps (0 = never)"),
    _env("EXL3_PREFETCH_K", "experts prefetched ahead per layer"),
    _env(
        "EXL3_HYBRID_CPU",
        "CPU expert-pool threads: a CPU list per tensor-parallel rank, ';' between ranks (planner)",
    ),
    _env(
        "EXL3_HYBRID_LAYERS",
        "MoE layers that may run missed experts on the CPU pool, list format (planner output)",
    ),
    _env("EXL3_HYBRID_GPU_FRAC", "share of expert work kept on the GPU in hybrid mode"),
    _env("EXL3_HYBRID_ADMIT_CPU", "admit CPU-served experts into the GPU cache"),
    _env("EXL3_HYBRID_FUSED_SUBMIT", "submit CPU expert work in one call per layer"),
    _env("EXL3_HYBRID_OVERLAP_GATHER", "overlap CPU expert work with the GPU gather"),
    _env(
        "OMP_NUM_THREADS", "OpenMP threads: the CPU pool's threads per rank (planner output)", "int", bounds=(1, 65536)
    ),
    _env("EXL3_PREFILL_DMA_STAGE_EXPERTS", "experts staged per DMA batch during prefill"),
    _env("EXL3_PREFILL_DMA_MIN_TOKENS", "prefill size from which experts are streamed by DMA"),
    _env("EXL3_PREFILL_DMA_FAT_MODE", "DMA prefill through the fat kernel"),
    _env("EXL3_FUSED_MOE", "fused EXL3 MoE kernel"),
    _env("EXL3_MOE_GEMV", "GEMV kernel for single-token MoE"),
    _env("EXL3_BF16_IO", "bf16 activations in and out of EXL3 kernels"),
    _env("EXL3_FUSED_DECODE_ROUTE_PREP", "fuse routing preparation into decode"),
    _env("EXL3_MERGED_QKV", "merged QKV projection"),
    _env("EXL3_MOE_HIT_GROUPS", "kernel groups for cache-hit experts"),
    _env("EXL3_MOE_MISS_GROUPS", "kernel groups for cache-miss experts"),
    _env("EXL3_MOE_MAX_SMS_PER_EXPERT", "SM cap per expert"),
    _env("EXL3_MOE_DECODE_GROUPS", "kernel groups in decode"),
    _env("EXL3_MOE_DECODE_GROUPS_MAX_TOKENS", "batch size up to which decode groups apply"),
    _env("EXL3_MOE_PREFILL_HOT_GROUPS", "kernel groups for hot experts in prefill"),
    _env("EXL3_MOE_PREFILL_COLD_GROUPS", "kernel groups for cold experts in prefill"),
    _env("EXL3_MOE_PREFILL_HYBRID_GROUPS", "kernel groups for hybrid experts in prefill"),
    _env("EXL3_MOE_ROW_TILE", "row tile of the MoE kernel"),
    _env("EXL3_TEMP_ROWS_FUSED", "temporary rows of the fused kernel"),
    _env("EXL3_FAT_KERNEL", "one kernel for all experts of a layer"),
    _env("EXL3_FAT_BATCHED", "batched variant of the fat kernel"),
    _env("EXL3_FAT_SORTED", "sort tokens by expert for the fat kernel"),
    _env("EXL3_MULTILINEAR_GATE_UP", "gate and up projections in one multilinear call"),
    _env("EXL3_MULTILINEAR_MAX_ROWS", "row cap of the multilinear call"),
    _env("EXL3_DETERMINISTIC_MOE", "deterministic MoE reduction order"),
    _env("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "run the shared expert on the main stream"),
    _env("GLM53_FAST_MHC", "fused multi-head compression of the GLM-5.3 overlay"),
    _env("GLM53_FAST_ROUTER", "fused router"),
    _env("GLM53_FAST_TOPK", "fused top-k"),
    _env("GLM53_SKIP_DUP_ROUTER", "skip the duplicated router pass"),
    _env("GLM53_SPARSE_MLA_KV_SPLITS", "KV splits of sparse MLA decode"),
    _env("VLLM_GLM53_SM86_TILELANG_MHC", "TileLang MHC kernel on sm_86"),
    _env("VLLM_GLM53_SM86_MLA_QUERY_CHUNK", "MLA query chunk on sm_86"),
    _env("VLLM_GLM53_INDEXER_HEADS", "sparse-attention indexer heads computed per pass"),
    _env("VLLM_GLM53_INDEXER_WS_BY_SEQS", "indexer workspace sized by sequences"),
    _env("VLLM_GLM53_EMBED_UVA", "embedding table in host memory through UVA"),
    _env("VLLM_GLM53_DETERMINISTIC_TOPK", "deterministic indexer top-k"),
    _env("VLLM_KV_CACHE_LAYOUT", "KV cache layout (e.g. NHD / HND)"),
    _env(
        "VLLM_DEFAULT_THINKING_TOKEN_BUDGET",
        "thinking tokens before reasoning_end_str is forced",
        "int",
        bounds=(0, _INT31),
    ),
    _env("GLM53_PRESERVE_REASONING_TURNS", "assistant turns whose reasoning is kept in the prompt"),
    # Environment glm53 adds: offline serving, and vLLM's CPU backend.
    _env(
        "HF_HUB_OFFLINE",
        "serve the verified local checkpoint; never reach the Hub",
        "bool",
        recipe=False,
        engines=_BOTH,
    ),
    _env("TRANSFORMERS_OFFLINE", "same for transformers", "bool", recipe=False, engines=_BOTH),
    _env("VLLM_NO_USAGE_STATS", "no usage reporting", "bool", recipe=False),
    _env("DO_NOT_TRACK", "no usage reporting (generic switch)", "bool", recipe=False, engines=_BOTH),
    _env("VLLM_CPU_KVCACHE_SPACE", "GiB of KV cache on vLLM's CPU backend", "int", recipe=False, bounds=(1, 65536)),
    _env(
        "VLLM_CPU_OMP_THREADS_BIND",
        "CPU backend: cores the engine's OpenMP threads bind to (auto, 0-3, ...)",
        recipe=False,
    ),
    # Which engine serves the profile; glm53 reads it, neither engine does.
    KeySpec(
        "ENGINE",
        "str",
        "meta",
        "the engine: vllm (the recipe's) or exllamav3 (TabbyAPI + ExLlamaV3)",
        recipe=False,
        engines=_BOTH,
        choices=ENGINES,
    ),
    KeySpec(
        "GPUS",
        "int",
        "meta",
        "exllamav3: GPUs the layers are split over (the first N the driver lists)",
        recipe=False,
        bounds=(1, 64),
        engines=_EXL3,
    ),
    # --- exllamav3: fields of TabbyAPI's config.yml (common/config_models.py, ModelConfig) ---
    _tabby(
        "CACHE_SIZE",
        "int",
        "model.cache_size",
        "KV cache of the DSA layers in tokens: a multiple of 256, at least MAX_MODEL_LEN (planner output)",
        bounds=(256, _INT31),
    ),
    _tabby(
        "CACHE_MODE",
        "str",
        "model.cache_mode",
        "cache precision: FP16, Q8, Q6, Q4 or K,V bits (e.g. 8,6)",
        # TabbyAPI's CACHE_TYPE: the legacy names or a k_bits,v_bits pair of 2-8
        pattern=(r"FP16|Q8|Q6|Q4|[2-8]\s*,\s*[2-8]", "FP16, Q8, Q6, Q4 or two bit widths 2-8 like 8,6"),
    ),
    _tabby(
        "GPU_SPLIT",
        "str",
        "model.gpu_split",
        "GiB of weights per GPU in layer order, comma-separated (planner output; empty = autosplit)",
        number_list=True,
    ),
    _tabby(
        "AUTOSPLIT_RESERVE",
        "str",
        "model.autosplit_reserve",
        "MiB kept free per GPU for cache, state and scratch when autosplitting, comma-separated (planner output)",
        number_list=True,
    ),
    _tabby("CHUNK_SIZE", "int", "model.chunk_size", "prompt tokens ingested per forward pass", bounds=(256, 65536)),
    _tabby(
        "CPU_MOE_OFFLOAD_LAYERS",
        "int",
        "model.cpu_moe_offload_layers",
        "whole-layer CPU offload: routed experts of the first N MoE layers run on the CPU (planner output; "
        "TabbyAPI sets ExLlamaV3's moe_cpu_offload from it, overriding EXL3_MOE_CPU_OFFLOAD)",
        bounds=(0, 4096),
    ),
    _tabby(
        "PROMPT_TEMPLATE",
        "path",
        "model.prompt_template",
        f"a .jinja file, or {BUILTIN_CHAT_TEMPLATE} for the packaged one; empty = the checkpoint's own",
    ),
    _tabby("REASONING", "bool", "model.reasoning", "split the answer into reasoning_content and content"),
    _tabby("REASONING_START_TOKEN", "str", "model.reasoning_start_token", "opens the reasoning block"),
    _tabby("REASONING_END_TOKEN", "str", "model.reasoning_end_token", "closes the reasoning block"),
    _tabby(
        "REASONING_BUDGET_TOKENS",
        "int",
        "model.reasoning_budget_tokens",
        "reasoning tokens before the server forces the end of reasoning",
        bounds=(0, _INT31),
    ),
    _tabby(
        "REASONING_BUDGET_MESSAGE",
        "json",
        "model.reasoning_budget_message",
        'text injected before the forced end of reasoning, as a JSON string ("\\n\\nI have thought ...")',
    ),
    _tabby("TOOL_FORMAT", "str", "model.tool_format", "parser of the model's tool calls (glm4_5 for GLM)"),
    # --- exllamav3: ExLlamaV3's own environment (exllamav3/model/config.py, modules/block_sparse_mlp_cpu.py) ---
    _env(
        "EXL3_MOE_CPU_SPLIT",
        "per-layer split: the tail N routed experts of every eligible MoE layer run on the CPU (planner output)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 32767),
    ),
    _env(
        "EXL3_MOE_CPU_SPLIT_LAYERS",
        "split only the first N eligible MoE layers (0 = all; planner output)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 4096),
    ),
    _env(
        "EXL3_MOE_CPU_THREADS",
        "threads of the CPU expert worker (planner output: the planned CPU pool)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(1, 65536),
    ),
    _env(
        "EXL3_MOE_CPU_SWAP",
        "dynamic placement: 1 swaps hot CPU experts with cold GPU ones; 0 = static (with EXL3_MOE_CPU_SPLIT_STATS)",
        recipe=False,
        engines=_EXL3,
        choices=("0", "1"),
    ),
    _env(
        "EXL3_MOE_CPU_PIN",
        "pin the CPU worker's threads to physical cores (1, ExLlamaV3's default) or not (0: docs/serve.md says why)",
        recipe=False,
        engines=_EXL3,
        choices=("0", "1"),
    ),
    _env(
        "EXL3_MOE_CPU_SWAP_INTERVAL",
        "forward passes (decode steps, prefill chunks) between placement sweeps (ExLlamaV3's default 128)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(1, _INT31),
    ),
    _env(
        "EXL3_MOE_CPU_SWAP_HYST",
        "a sweep swaps while the hottest CPU expert's count is at least this times the coldest GPU one's (default 2)",
        "float",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 1e9),
    ),
    _env(
        "EXL3_MOE_CPU_SWAP_FLOOR",
        "and at least this times a layer's mean count per expert (ExLlamaV3's default 8; 0 = no floor)",
        "float",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 1e9),
    ),
    _env(
        "EXL3_MOE_CPU_SWAP_MAX",
        "swaps a sweep makes over all split layers at most (ExLlamaV3's default 64; 0 = none)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, _INT31),
    ),
    _env(
        "EXL3_MOE_CPU_SPLIT_STATS",
        "static placement: JSON of per-expert routing counts per MoE layer (`glm53 plan host --stats`)",
        "path",
        recipe=False,
        engines=_EXL3,
    ),
    # --- exllamav3: glm53's GPU expert cache (pkgs/exllamav3/expert-cache), run inside TabbyAPI's process ---
    _env(
        "EXPERT_CACHE",
        "1: one-token decode steps look their experts up in a per-layer GPU cache (pinned + LRU window), misses "
        "copied from page-locked host memory; exact (docs/serve.md)",
        recipe=False,
        engines=_EXL3,
        choices=("0", "1"),
    ),
    _env(
        "EXPERT_CACHE_WINDOW",
        "LRU slots per MoE layer beside the pinned ones (planner output)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 8192),
    ),
    _env(
        "EXPERT_CACHE_PINNED",
        "slots per MoE layer pinned to the layer's hottest experts by EXPERT_CACHE_STATS (planner output)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 8192),
    ),
    _env(
        "EXPERT_CACHE_STATS",
        "JSON of per-expert routing counts per MoE layer that ranks the pinned experts (the split's stats format)",
        "path",
        recipe=False,
        engines=_EXL3,
    ),
    _env(
        "EXPERT_CACHE_POLICY",
        "lru: the window keeps the most recently used experts (beside the pinned ones); frequency: it keeps the "
        "experts of the last EXPERT_CACHE_RECENT steps, then the highest decayed counts (no pinned slots)",
        recipe=False,
        engines=_EXL3,
        choices=("lru", "frequency"),
    ),
    _env(
        "EXPERT_CACHE_RECENT",
        "frequency policy: steps whose experts are kept before any count (default 1)",
        "int",
        recipe=False,
        engines=_EXL3,
        bounds=(0, 1 << 20),
    ),
    _env(
        "EXPERT_CACHE_EXPERTS",
        "where the routed experts' home copies are: gpu (ExLlamaV3's loader, every expert on a GPU too) or host "
        "(read from the checkpoint into host memory only; one layer staged on the GPU for prefill)",
        recipe=False,
        engines=_EXL3,
        choices=("gpu", "host"),
    ),
    _env(
        "EXPERT_CACHE_HALF_LIFE",
        "frequency policy: steps over which an expert's count decays by half (default 256)",
        "float",
        recipe=False,
        engines=_EXL3,
        bounds=(0.01, 1e12),
    ),
)

KEYS: dict[str, KeySpec] = {spec.key: spec for spec in _SPECS}
CONFIG_SPECS: tuple[KeySpec, ...] = tuple(spec for spec in _SPECS if spec.config is not None)
FLAG_SPECS: tuple[KeySpec, ...] = tuple(spec for spec in _SPECS if spec.role == "flag")
RECIPE_KEYS: tuple[str, ...] = tuple(spec.key for spec in _SPECS if spec.recipe)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Setting(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    value: str
    origin: Origin
    # Where exactly: "agent-256k.env:12", "/etc/glm53.env:3", "environment", "--set".
    source: str


class Profile(BaseModel):
    """A named set of values for the keys above. Empty = unset (no flag, the variable is not set)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    settings: dict[str, Setting]

    def value(self, key: str) -> str:
        if key not in KEYS:
            raise KeyError(key)
        setting = self.settings.get(key)
        return setting.value if setting else ""

    def is_set(self, key: str) -> bool:
        return self.value(key) != ""

    def flag_bool(self, key: str) -> bool | None:
        raw = self.value(key)
        return None if raw == "" else raw.lower() in _TRUE

    @property
    def engine(self) -> Engine:
        """The engine that serves this profile (ENGINE; vllm when unset, as every profile before it was)."""
        return engine_named(self.value("ENGINE"))

    def env_exports(self) -> dict[str, str]:
        """The engine environment: every env-role key of this engine that has a value, in key order."""
        engine = self.engine
        return {
            s.key: self.settings[s.key].value
            for s in _SPECS
            if s.role == "env" and engine in s.engines and s.key in self.settings and self.settings[s.key].value != ""
        }


@dataclass(frozen=True)
class _Line:
    key: str
    value: str
    lineno: int


_DEFAULT_LINE = re.compile(r'^:\s+"\$\{(?P<key>[A-Za-z_][A-Za-z0-9_]*):=(?P<rest>.*)$')
_ASSIGN_LINE = re.compile(r"^(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<rest>.*)$")


def _parse_default_word(rest: str, *, where: str) -> str:
    """The word of `"${KEY:=word}"` as bash reads it: `\\` escapes $ ` " \\ }; a bare } ends it."""
    out: list[str] = []
    i = 0
    while i < len(rest):
        ch = rest[i]
        if ch == "\\" and i + 1 < len(rest):
            nxt = rest[i + 1]
            if nxt in '$`"\\}':
                out.append(nxt)
            else:
                out.append("\\" + nxt)
            i += 2
            continue
        if ch in "$`":
            raise BadInput(
                f"{where}: expansions ($, `) are not supported in profile values",
                fix="write the value literally, or escape the character with a backslash",
            )
        if ch == "}":
            tail = rest[i + 1 :].strip()
            if not tail.startswith('"') or (tail[1:].strip() and not tail[1:].strip().startswith("#")):
                raise BadInput(
                    f'{where}: expected `"` after the closing brace',
                    fix='write lines as : "${KEY:=value}" (escape } inside the value as \\})',
                )
            return "".join(out)
        if ch == '"':
            raise BadInput(f"{where}: unescaped double quote inside the value", fix='escape it as \\"')
        out.append(ch)
        i += 1
    raise BadInput(f"{where}: no closing brace", fix='write lines as : "${KEY:=value}"')


def _parse_assign_value(rest: str, *, where: str) -> str:
    value = rest.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        if value[0] == '"':
            inner = re.sub(r'\\([$`"\\])', r"\1", inner)
        return inner
    if " #" in value:
        value = value.split(" #", 1)[0].rstrip()
    if any(ch in value for ch in " \t'\""):
        raise BadInput(
            f"{where}: a value with spaces or quotes must be quoted as a whole",
            fix="write KEY='value with spaces'",
        )
    return value


def parse_env_text(text: str, *, source: str) -> tuple[list[_Line], list[str]]:
    """Lines of a profile or .env file: `: "${KEY:=default}"` or `KEY=value` (also `export KEY=value`).

    Returns the assignments and the comment lines (the profile's description and notes).
    """
    lines: list[_Line] = []
    comments: list[str] = []
    if text.startswith("\ufeff"):
        raise BadInput(
            f"{source} starts with a byte order mark (BOM), which a shell reads as part of the first key",
            fix="save the file as UTF-8 without BOM",
        )
    # Lines end at \n (and \r\n) only: str.splitlines() would also split at \x1c, \x85 or \u2028 inside a value.
    for lineno, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        where = f"{source}:{lineno}"
        bad = next((char for char in raw if char != "\t" and not char.isprintable()), None)
        if bad is not None:
            raise BadInput(
                f"{where}: holds the control or invisible character {printable(bad)} (U+{ord(bad):04X})",
                fix="values are plain text: remove it (a terminal or a shell would act on it)",
            )
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            comments.append(line.lstrip("#").strip())
            continue
        match = _DEFAULT_LINE.match(line)
        if match:
            lines.append(_Line(match["key"], _parse_default_word(match["rest"], where=where), lineno))
            continue
        match = _ASSIGN_LINE.match(line)
        if match:
            lines.append(_Line(match["key"], _parse_assign_value(match["rest"], where=where), lineno))
            continue
        raise BadInput(
            f"{where}: cannot read this line: {line[:80]!r}",
            fix='use : "${KEY:=value}" or KEY=value lines, and # for comments',
        )
    return lines, comments


def unknown_key_error(key: str, *, where: str) -> BadInput:
    close = difflib.get_close_matches(key.upper(), list(KEYS), n=4, cutoff=0.6)
    fix = f"did you mean {', '.join(close)}?" if close else "docs/serve.md lists the known keys"
    return BadInput(f"{where}: unknown key {key!r}", fix=fix)


def _check_value(spec: KeySpec, value: str, *, where: str) -> None:
    if value == "":
        return
    bad: str | None = None
    number: float | None = None
    if spec.kind == "int":
        if not re.fullmatch(r"-?[0-9]+", value):
            bad = "an integer"
        else:  # a 40-digit number is out of every range; do not convert it
            number = int(value) if len(value) <= 30 else math.inf
    elif spec.kind == "float":
        try:
            number = float(value)
        except ValueError:
            bad = "a number"
        else:
            if not math.isfinite(number):
                bad, number = "a finite number", None
    elif spec.kind == "bool":
        if value.lower() not in _TRUE | _FALSE:
            bad = "1 or 0 (true/false, yes/no, on/off)"
    elif spec.kind == "json":
        try:
            parse_json(value, what=spec.key)
        except BadInput:
            bad = "valid JSON"
    elif spec.choices is not None and value not in spec.choices:
        bad = "one of " + ", ".join(spec.choices)
    elif spec.pattern is not None and not re.fullmatch(spec.pattern[0], value):
        bad = spec.pattern[1]
    elif spec.number_list and parse_number_list(value) is None:
        bad = "a comma-separated list of numbers (e.g. 21.5,23)"
    if number is not None and not spec.bounds[0] <= number <= spec.bounds[1]:
        low, high = (f"{b:g}" if spec.kind == "float" else f"{int(b):,}" for b in spec.bounds)
        bad = f"between {low} and {high}"
    if bad:
        raise BadInput(f"{where}: {spec.key}={value[:60]!r} is not {bad}", fix=f"{spec.key}: {spec.doc}")


_NUMBER = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")


def parse_number_list(value: str) -> list[float] | None:
    """'21.5, 23' -> [21.5, 23.0]; None unless every item is a plain non-negative number (at most 64 items)."""
    items = [item.strip() for item in value.split(",")]
    if not 0 < len(items) <= 64 or not all(_NUMBER.fullmatch(item) for item in items):
        return None
    return [float(item) for item in items]


def _check_engine(settings: Mapping[str, Setting], name: str) -> None:
    """A profile sets only keys its engine reads: a vLLM flag in a TabbyAPI profile would silently do nothing."""
    engine = settings["ENGINE"].value if "ENGINE" in settings and settings["ENGINE"].value else "vllm"
    for setting in settings.values():
        spec = KEYS[setting.key]
        if setting.value != "" and engine not in spec.engines:
            readers = " and ".join(spec.engines)
            raise BadInput(
                f"{setting.source}: {setting.key} is read by {readers} only, and profile {name} runs on {engine}",
                fix=f"remove {setting.key}, or choose a {readers} profile (glm53 profile list)",
            )


def _profile_text(name: str) -> str:
    return resources.files("glm53").joinpath(PROFILES_RESOURCE, f"{name}.env").read_text(encoding="utf-8")


def _profile_layers(name: str, seen: tuple[str, ...] = ()) -> tuple[str, list[Setting]]:
    """The settings of a packaged profile, its `extends` base first; and its description."""
    if name not in PROFILE_NAMES:
        close = difflib.get_close_matches(name, PROFILE_NAMES, n=3, cutoff=0.4)
        fix = f"did you mean {', '.join(close)}?" if close else f"known profiles: {', '.join(PROFILE_NAMES)}"
        raise BadInput(f"--profile: unknown profile {name!r}", fix=fix)
    if name in seen:
        raise BadInput(f"profile {name} extends itself through {' -> '.join(seen)}")
    source = f"{name}.env"
    lines, comments = parse_env_text(_profile_text(name), source=source)
    description = comments[0] if comments else name
    settings: list[Setting] = []
    for comment in comments:
        if comment.startswith("extends:"):
            _, base = _profile_layers(comment.split(":", 1)[1].strip(), (*seen, name))
            settings.extend(base)
    for line in lines:
        where = f"{source}:{line.lineno}"
        if line.key not in KEYS:
            raise unknown_key_error(line.key, where=where)
        _check_value(KEYS[line.key], line.value, where=where)
        settings.append(Setting(key=line.key, value=line.value, origin="profile", source=where))
    return description, settings


def parse_set_options(items: Sequence[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--set {item!r}: expected KEY=VALUE", fix="e.g. --set MAX_MODEL_LEN=131072")
        pairs.append((key.strip(), value))
    return pairs


def load_profile(
    name: str = DEFAULT_PROFILE,
    *,
    environ: Mapping[str, str] | None = None,
    env_file: tuple[Path, str] | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    plan: Sequence[tuple[str, str, str]] = (),
) -> Profile:
    """Build a profile: packaged defaults, then an env file's text, the environment, then `--set` pairs.

    `env_file` is (path, text): the caller reads the file, so this stays a pure function. `plan` holds the
    planner's (key, value, where) triples; keys that are not profile keys (HYBRID_MAIN_CPUS) are skipped here:
    they are the launch's business.
    """
    description, layered = _profile_layers(name)
    settings: dict[str, Setting] = {}
    for setting in layered:
        settings[setting.key] = setting
    # The engine is the profile's own: an env file, the environment or --set may not change it.
    engine = (settings["ENGINE"].value if "ENGINE" in settings else "") or "vllm"
    for key, value, where in plan:
        if key in KEYS:
            _check_value(KEYS[key], value, where=where)
            settings[key] = Setting(key=key, value=value, origin="plan", source=where)
    if env_file is not None:
        path, text = env_file
        lines, _ = parse_env_text(text, source=str(path))
        for line in lines:
            where = f"{path}:{line.lineno}"
            if line.key not in KEYS:
                raise unknown_key_error(line.key, where=where)
            _check_value(KEYS[line.key], line.value, where=where)
            settings[line.key] = Setting(key=line.key, value=line.value, origin="env-file", source=where)
    for key in KEYS:
        # The environment holds variables meant for other programs: another engine's keys are not this one's.
        spec = KEYS[key]
        if environ is not None and key in environ and spec.role != "meta" and engine in spec.engines:
            value = environ[key]
            _check_value(KEYS[key], value, where=f"environment variable {key}")
            settings[key] = Setting(key=key, value=value, origin="env", source="environment")
    for key, value in overrides:
        if key not in KEYS:
            raise unknown_key_error(key, where=f"--set {key}={value}")
        _check_value(KEYS[key], value, where=f"--set {key}")
        settings[key] = Setting(key=key, value=value, origin="set", source="--set")
    ordered = {spec.key: settings[spec.key] for spec in _SPECS if spec.key in settings}
    chosen = ordered.get("ENGINE")
    if chosen is not None and chosen.origin != "profile" and (chosen.value or "vllm") != engine:
        raise BadInput(
            f"{chosen.source}: ENGINE={chosen.value} differs from profile {name}'s engine ({engine})",
            fix="the engine belongs to the profile: choose a profile of that engine (glm53 profile list)",
        )
    _check_engine(ordered, name)
    return Profile(name=name, description=description, settings=ordered)


def read_env_file(path: Path, *, flag: str = "--env-file") -> tuple[Path, str]:
    """Read an env file for `load_profile`, naming the file in every error (a pipe or a huge file too)."""

    return path, read_text_bounded(path, what=flag, max_bytes=ENV_FILE_MAX_BYTES)
