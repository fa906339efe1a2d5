"""The embedded default: a tiny GLM-style MoE checkpoint built offline, locked, verified and served on CPU.

The checkpoint is a `Glm4MoeForCausalLM` at toy size (2 layers, hidden 128, 8 routed + 1 shared expert) with
random bf16 weights saved by transformers, a byte-level BPE tokenizer of 1,024 tokens trained offline with
`tokenizers` on a built-in corpus, and the project's bounded-thinking chat template. Nothing is downloaded.
It answers nonsense, quickly: it exists so that the whole path (lock -> verify -> serve -> bench) runs for
real on any machine, GPU or not.

torch, transformers and tokenizers are imported inside `build_tiny_checkpoint` only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict

from glm53.checkpoint.lock import default_lock_path, lock_from_directory, write_lock
from glm53.checkpoint.verify import verify_checkpoint
from glm53.errors import BadInput, CheckFailed, Unavailable
from glm53.host.native_libs import require_engine_libraries
from glm53.output import Output
from glm53.preflight.doctor import port_error
from glm53.serve.chat_template import bounded_template_text
from glm53.serve.launch import check_host
from glm53.serve.resolve import ServeRequest
from glm53.serve.start import start

TINY_MODEL_NAME = "glm53-tiny"
TINY_VOCAB_SIZE = 1024

# Tokens the GLM chat format and its vLLM parsers (glm45 reasoning, glm47 tool calls) look for.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
)

# A few paragraphs of plain text to train the byte-level BPE on; the exact words do not matter.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog while the model thinks about the weather in Paris.",
    "A mixture of experts routes every token to a few experts and one shared expert, then adds them up.",
    "Serving a model means loading its weights, planning memory for the cache and answering requests.",
    "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    '{"city": "Paris", "unit": "celsius", "answer": 391, "tool": "get_weather"}',
    "Seventeen times twenty-three is three hundred ninety-one; check it twice before you act.",
    "Locks pin every file by size and sha256 so that a changed byte is caught before serving.",
    "Tensor parallel splits layers across GPUs; expert offload keeps cold experts in host memory.",
)


class TinyCheckpoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_dir: Path
    architecture: str
    num_layers: int
    hidden_size: int
    routed_experts: int
    vocab_size: int
    files: list[str]


def tiny_config_dict() -> dict[str, object]:
    """The model config: built in seconds, shaped like the real MoE (routed + shared experts)."""
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        # vLLM's CPU attention backend takes head sizes 32, 64, 80, ...
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "use_qk_norm": False,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "torch_dtype": "bfloat16",
    }


def looks_like_tiny_model(model_dir: Path) -> bool:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    expected = tiny_config_dict()
    return isinstance(config, dict) and all(
        config.get(k) == expected[k] for k in ("model_type", "hidden_size", "vocab_size", "num_hidden_layers")
    )


def _train_tokenizer(out_dir: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # optional: demo extra

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    if any(value is None for value in ids.values()):
        raise Unavailable("the tokenizer trainer dropped a special token", fix="upgrade `tokenizers`")
    return {token: int(value) for token, value in ids.items() if value is not None}


def build_tiny_checkpoint(out_dir: Path, *, seed: int = 0, force: bool = False) -> TinyCheckpoint:
    """Write the tiny checkpoint into `out_dir` (built in a sibling temp dir, then renamed into place)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not force:
            raise BadInput(
                f"{out_dir} already exists and is not empty",
                fix="choose another --model-dir or pass --force to rebuild it",
            )
        if not looks_like_tiny_model(out_dir):
            raise BadInput(
                f"refusing to replace {out_dir}: it is not a tiny demo model",
                fix="point --model-dir at an empty or new directory",
            )
    try:
        # optional and heavy: the demo extra (torch, transformers) builds the tiny model
        import torch
        from transformers import AutoModelForCausalLM, Glm4MoeConfig
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise Unavailable(
            f"building the tiny model needs torch and transformers ({exc.name} is missing)",
            fix="install the demo extra: pip install 'glm53[demo]' (make setup does)",
        ) from exc

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        special = _train_tokenizer(staging)
        config_values = tiny_config_dict()
        config_values["eos_token_id"] = [
            special["<|endoftext|>"],
            special["<|user|>"],
            special["<|observation|>"],
        ]
        config_values["pad_token_id"] = special["<|endoftext|>"]
        config_values["bos_token_id"] = None
        torch.manual_seed(seed)
        config_kwargs: dict[str, Any] = {
            k: v for k, v in config_values.items() if k not in ("architectures", "model_type")
        }
        config = Glm4MoeConfig(**config_kwargs)
        config.architectures = ["Glm4MoeForCausalLM"]
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.bfloat16
        )
        model.save_pretrained(staging, safe_serialization=True)

        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": int(config_values["max_position_embeddings"]),  # type: ignore[call-overload]
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {
                str(idx): {
                    "content": tok,
                    "special": True,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                }
                for tok, idx in sorted(special.items(), key=lambda item: item[1])
            },
        }
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        (staging / "special_tokens_map.json").write_text(
            json.dumps({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, indent=2) + "\n"
        )
        (staging / "chat_template.jinja").write_text(bounded_template_text())
        generation = {
            "eos_token_id": config_values["eos_token_id"],
            "pad_token_id": special["<|endoftext|>"],
            "do_sample": False,
        }
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        staging.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = sorted(p.name for p in out_dir.iterdir() if p.is_file())
    return TinyCheckpoint(
        model_dir=out_dir,
        architecture="Glm4MoeForCausalLM",
        num_layers=int(config_values["num_hidden_layers"]),  # type: ignore[call-overload]
        hidden_size=int(config_values["hidden_size"]),  # type: ignore[call-overload]
        routed_experts=int(config_values["n_routed_experts"]),  # type: ignore[call-overload]
        vocab_size=TINY_VOCAB_SIZE,
        files=files,
    )


class DemoModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_dir: Path
    lock_path: Path
    built: bool
    locked: bool
    verified: str  # the verifier's summary


def default_demo_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "glm53" / "demo" / TINY_MODEL_NAME


def prepare_demo_model(model_dir: Path | None = None, *, rebuild: bool = False) -> DemoModel:
    """Build the tiny checkpoint if needed, lock it if unlocked, verify it through the checkpoint library.

    A directory that exists but fails verification is an error (it was changed after locking): rebuild it.
    """
    target = Path(model_dir) if model_dir is not None else default_demo_dir()
    if target.exists() and not target.is_dir():
        raise BadInput(f"--model-dir: {target} is not a directory", fix="point it at a new or empty directory")
    lock_path = default_lock_path(target)
    built = locked = False
    if (target / "config.json").is_file() and not looks_like_tiny_model(target):
        raise BadInput(
            f"{target} holds another model, not the tiny demo model",
            fix="point --model-dir at an empty or new directory (the demo writes its lock there)",
        )
    if rebuild or not (target / "config.json").is_file():
        build_tiny_checkpoint(target, force=True)
        built = True
    if built or not lock_path.is_file():
        write_lock(lock_from_directory(target, repo=None, revision=None), lock_path, force=True)
        locked = True
    report = verify_checkpoint(target, lock_path)
    if not report.ok:
        raise CheckFailed(
            f"the demo model in {target} does not match its lock: {report.summary}",
            fix="rebuild it with `glm53 demo --rebuild`",
        )
    return DemoModel(model_dir=target, lock_path=lock_path, built=built, locked=locked, verified=report.summary)


# Thinking off: the answer is in `content`. With thinking on (the chat template's default), the glm45 reasoning
# parser files everything before `</think>` under `reasoning`, and the random weights of the tiny model never
# write `</think>`: `content` would be null.
SAMPLE_TEMPLATE_KWARGS = {"enable_thinking": False}


def sample_body(model_name: str) -> dict[str, object]:
    return {
        "model": model_name,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 32,
        "chat_template_kwargs": SAMPLE_TEMPLATE_KWARGS,
    }


def sample_request(base_url: str, model_name: str) -> str:
    body = json.dumps(sample_body(model_name))
    return f"curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


def demo_start_checks(host: str, port: int) -> None:
    """Before the model is built: the address, the engine's libraries and the port, in seconds."""
    check_host(host, listen_all=False)
    require_engine_libraries()
    problem = port_error(host, port)
    if problem is not None:
        raise BadInput(
            f"--port {port}: {host}:{port} is {problem}",
            fix="pass another --port (with make: make demo PORT=8001), or stop what listens there",
        )


def serve_demo(demo: DemoModel, host: str, port: int, out: Output) -> NoReturn:
    """Serve the tiny model through the one launch path, `--profile cpu-tiny`."""
    base_url = f"http://{host}:{port}"
    out.info(
        f"starting vLLM (CPU) on {base_url}; it answers GET {base_url}/health in about 30 s on 2 cores "
        "(a line for each stage). Ctrl-C stops it."
    )
    out.info(
        "try (random weights: the answer is noise; thinking is off, so it is the message's content):\n  "
        + sample_request(base_url, TINY_MODEL_NAME)
    )
    start(ServeRequest(profile="cpu-tiny", model_dir=demo.model_dir, host=host, port=port), out)
