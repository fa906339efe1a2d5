#!/usr/bin/env python3
"""Host-resident experts (EXPERT_CACHE_EXPERTS=host) in ExLlamaV3 1.4.6: the VRAM they save and the outputs they
give, against the stock engine, on a real EXL3 model.

1. Stock: the model loads as ExLlamaV3 loads it; greedy jobs run through its Generator while every MoE layer's
   forward records its input and output (prefill passes of several rows and one-token decode passes, in call
   order). Each recorded input is then run again through the same stock layer: the stock engine's own
   run-to-run difference.
2. Host: the model is unloaded and loaded again under glm53's runner hooks (`CacheRuntime` with
   EXPERT_CACHE_EXPERTS=host and an LRU window): every routed expert's trellis is read from the checkpoint into
   host memory, and the GPU holds one staging arena a device. The recorded inputs run through the host layers in
   the recorded order: several-row passes read the staged layer, one-token passes go through the cache.
   Each output is compared with the stock one, bit for bit; then the jobs run through the Generator.

Written to --out (JSON): the GPU memory each load allocated (the model and its KV cache), every pass's
comparison, the cache's counts.
Exit 0 when every one-row (decode) host output equals the stock output wherever the stock layer repeats itself
exactly, and every several-row (prefill) host output is within the largest difference the stock engine shows
between two runs of its own several-row passes: those sum in an order that varies from run to run, so a single
pass that repeats once proves nothing.

Needs a CUDA machine with ExLlamaV3 1.4.6 and both extensions (tools/exl3-gpu-run.sh setup prebuilt) and glm53
on PYTHONPATH. Usage: python3 tools/exl3-host-experts-check.py --model DIR --out FILE [--window 4]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--cache-tokens", type=int, default=4096)
    args = parser.parse_args()

    import torch
    from exl3_greedy_jobs import greedy_jobs  # this folder's
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP

    from glm53.serve.engines.exllamav3.expert_cache import CacheRuntime, CacheSettings, LayerExpertCache, _hook

    cache_ext = importlib.import_module("glm53_expert_cache")  # after torch, whose libraries it links against
    recorded: list[tuple[str, Any, Any]] = []
    recording = {"on": False}
    original_forward = BlockSparseMLP.forward

    def forward(self: Any, x: Any, params: dict, out_dtype: Any = None) -> Any:
        out = original_forward(self, x, params, out_dtype)
        if recording["on"]:
            recorded.append((self.key, x.detach().clone(), out.detach().clone()))
        return out

    BlockSparseMLP.forward = forward  # type: ignore[method-assign]
    config = Config.from_directory(args.model)
    vocab = int(
        json.loads((Path(args.model) / "config.json").read_text()).get("text_config", {}).get("vocab_size", 512)
    )

    def load() -> tuple[Any, Any, Any, float, int]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()  # the recorded passes stay on the GPU: counted out
        started = time.perf_counter()
        model = Model.from_config(config)
        cache = Cache(model, max_num_tokens=args.cache_tokens)
        model.load()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        generator = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))
        return model, cache, generator, seconds, int(torch.cuda.memory_allocated() - before)

    def generate(generator: Any) -> list[list[int]]:
        return greedy_jobs(generator, args.jobs, args.prompt, args.new, vocab)

    def replay(model: Any, before: Any = None) -> list[Any]:
        layers = {key: model.find_module(key) for key in {key for key, _, _ in recorded}}
        outs = []
        with torch.inference_mode():
            for key, x, _ in recorded:
                if before is not None:
                    before(key, x)
                outs.append(original_forward(layers[key], x.clone(), {}).detach().clone())
        torch.cuda.synchronize()
        return outs

    def compare(outs: list[Any]) -> dict[str, Any]:
        """How many passes equal the stock ones, one-row and several-row, where the stock layer repeats itself."""
        one = [
            torch.equal(o, r[2]) for o, r, rep in zip(outs, recorded, repeats, strict=True) if rep and rows(r[1]) == 1
        ]
        many = [torch.equal(o, r[2]) for o, r in zip(outs, recorded, strict=True) if rows(r[1]) > 1]
        worst = max(float((o.float() - r[2].float()).abs().max()) for o, r in zip(outs, recorded, strict=True))
        return {"one_row_equal": sum(one), "one_row_repeating": len(one), "multi_row_equal": sum(many),
                "multi_row": len(many), "max_abs_difference": worst}  # fmt: skip

    report: dict[str, Any] = {"args": vars(args), "device": torch.cuda.get_device_name()}
    model, cache, generator, seconds, allocated = load()
    report["stock"] = {"load_seconds": round(seconds, 2), "allocated_bytes": allocated}
    recording["on"] = True
    report["stock"]["tokens"] = generate(generator)
    recording["on"] = False
    stock_again = replay(model)
    repeats = [bool(torch.equal(a, out)) for a, (_, _, out) in zip(stock_again, recorded, strict=True)]
    stock_differences = [
        float((a.float() - out.float()).abs().max()) for a, (_, _, out) in zip(stock_again, recorded, strict=True)
    ]
    print(f"stock: {allocated / 2**20:.1f} MiB after load, {len(recorded)} MoE passes recorded, "
          f"{sum(repeats)} repeat bit for bit", flush=True)  # fmt: skip
    # The same layers with the cache on their pointer tables, experts resident (EXPERT_CACHE_EXPERTS=gpu): a
    # one-row pass looks up and fetches into slots first, as the runner's routing hook does.
    gpu_caches: dict[str, Any] = {}

    def look_up(key: str, x: Any) -> None:
        if rows(x) != 1:
            return
        layer = model.find_module(key)
        if key not in gpu_caches:
            gpu_caches[key] = LayerExpertCache(layer, settings, [], cache_ext)
            original_routing = layer.routing_fn

            def routed(
                bsz: Any, cfg: Any, y: Any, params: dict, cache: Any = gpu_caches[key], fn: Any = original_routing
            ) -> Any:
                selected, weights = fn(bsz, cfg, y, params)
                if selected.shape[0] == 1:
                    cache.resolve(selected)
                return selected, weights

            layer.routing_fn = routed

    settings = CacheSettings(window=args.window, pinned=0, stats=None)
    report["gpu_cache"] = compare(replay(model, look_up))
    print("cache, experts resident:", json.dumps(report["gpu_cache"]), flush=True)
    for gpu_cache in gpu_caches.values():
        gpu_cache.close()
    model.unload()
    gpu_caches.clear()
    del model, cache, generator
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    report_file = Path(tempfile.mkdtemp()) / "expert-cache.json"
    runtime = CacheRuntime(
        CacheSettings(window=args.window, pinned=0, stats=None, experts="host"), report_file, cache_ext
    )
    host = runtime.host
    assert host is not None  # experts="host"
    _hook(runtime)
    model, _kv_cache, generator, seconds, allocated = load()
    report["host"] = {
        "load_seconds": round(seconds, 2),
        "allocated_bytes": allocated,
        "host_layers": len(host.layers),
        "host_pool_bytes": sum(layer.pool.numel() for layer in host.layers.values()),
        "arena_bytes": sum(a.numel() for a in host.arenas.values()),
    }
    print(f"host: {allocated / 2**20:.1f} MiB after load, {report['host']['host_layers']} layers' experts in "
          f"{report['host']['host_pool_bytes'] / 2**20:.1f} MiB of host memory, arena "
          f"{report['host']['arena_bytes'] / 2**20:.1f} MiB", flush=True)  # fmt: skip
    host_outs = replay(model)
    report["host_cache"] = compare(host_outs)
    print("cache, experts in host memory:", json.dumps(report["host_cache"]), flush=True)
    # diagnosis: the same with the layer staged before every pass (what a pass reads from the home copies)
    report["host_cache_staged"] = compare(replay(model, lambda key, x: host.stage(key)))
    print("cache, experts in host memory, staged before every pass:", json.dumps(report["host_cache_staged"]),
          flush=True)  # fmt: skip
    passes = []
    for (key, x, stock_out), host_out, repeat, stock_difference in zip(
        recorded, host_outs, repeats, stock_differences, strict=True
    ):
        passes.append(
            {
                "layer": key,
                "rows": rows(x),
                "equal": bool(torch.equal(host_out, stock_out)),
                "max_abs_difference": float((host_out.float() - stock_out.float()).abs().max()),
                "stock_repeats": repeat,
                "stock_difference": stock_difference,
            }
        )
    report["passes"] = passes
    report["host"]["tokens"] = generate(generator)  # the Generator runs on host-resident experts
    report["cache"] = runtime.write_report()
    decisive = [p for p in passes if p["stock_repeats"] and p["rows"] == 1]
    report["equal_where_stock_repeats"] = all(p["equal"] for p in decisive)
    report["decisive_passes"] = len(decisive)
    several = [p for p in passes if p["rows"] > 1]
    report["stock_multi_row_noise"] = max((p["stock_difference"] for p in several), default=0.0)
    report["multi_row_within_stock_noise"] = all(
        p["max_abs_difference"] <= report["stock_multi_row_noise"] for p in several
    )
    report["multi_row_passes_equal"] = sum(p["equal"] for p in passes if p["rows"] > 1)
    report["one_row_passes_equal"] = sum(p["equal"] for p in passes if p["rows"] == 1)
    report["vram_saved_bytes"] = report["stock"]["allocated_bytes"] - allocated
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("passes", "args")})[:3000], flush=True)
    ok = report["equal_where_stock_repeats"] and report["multi_row_within_stock_noise"] and len(decisive) > 0
    print("HOST-RESIDENT EXPERTS EQUAL TO THE STOCK ENGINE" if ok else "DIFFERENCE", flush=True)
    return 0 if ok else 1


def rows(x: Any) -> int:
    return int(x.view(-1, x.shape[-1]).shape[0])


if __name__ == "__main__":
    sys.exit(main())
