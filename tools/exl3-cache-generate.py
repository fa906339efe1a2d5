#!/usr/bin/env python3
"""The GPU expert cache inside ExLlamaV3 1.4.6's own forward: generate with and without it, compare, count.

Each MoE layer's `routing_fn` is wrapped (as glm53.serve.engines.exllamav3.routing records routing) so that after the
router picks a one-token pass's experts, `glm53_expert_cache.lookup` rewrites the layer's live pointer tables
(`multi_gate/up/down.ptrs_trellis`, which the BC_BlockSparseMLP graphs read) and `fetch` copies the misses
from the layer's page-locked host pool into its slots on a promotion stream, joined before the experts run.
The engine's kernels are unchanged.

ExLlamaV3 still loads every expert to the GPU here: the loader is not changed, so this checks exactness and
hit counts inside the real engine, not VRAM saved. Freed experts' table entries go back to those resident
copies (the lookup's home tables), which prefill (`exl3_moe`, `run_single_expert`) reads without a lookup.

Runs: the same greedy jobs stock three times (the first fills the page cache's prefix reuse; the third says
whether the stock engine repeats itself), then with the cache (pinned hottest by the stock run's counts + LRU
window + one step's staging). Checked: each layer's hit count equals glm53's simulator
(`policies.pinned_lru_step_hits`) on the decode steps the run routed, every resident slot holds its expert's
bytes, and, where two stock runs agree, every generated token and routed id equal the stock run's. Writes
--out (JSON); exit 0 when all hold.

Needs a CUDA machine with ExLlamaV3 1.4.6 and both extensions built (tools/exl3-gpu-run.sh build build-cache),
glm53 on PYTHONPATH. Usage: python3 tools/exl3-cache-generate.py --model DIR --out FILE [--window 4] [--pinned 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--pinned", type=int, default=2)
    parser.add_argument("--cache-tokens", type=int, default=4096)
    parser.add_argument("--policy", choices=("lru", "frequency"), default="lru", help="frequency: --pinned must be 0")
    parser.add_argument("--recent", type=int, default=1)
    parser.add_argument("--half-life", type=float, default=256.0)
    args = parser.parse_args()

    import numpy as np
    import torch
    from exl3_greedy_jobs import greedy_jobs  # this folder's
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP

    from glm53.plan.cache.policies import decayed_frequency, pinned_lru_step_hits
    from glm53.serve.engines.exllamav3.expert_cache import CacheSettings, LayerExpertCache

    # after torch, whose libraries the module links against
    cache_ext = importlib.import_module("glm53_expert_cache")
    settings = CacheSettings(
        window=args.window,
        pinned=args.pinned,
        stats=None,
        policy=args.policy,
        recent=args.recent,
        half_life=args.half_life,
    )

    layers: list[Any] = []
    original_init = BlockSparseMLP.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        original_init(self, *a, **k)
        routing_fn = getattr(self, "routing_fn", None)
        if routing_fn is None:
            return
        layers.append(self)
        self.glm53_decode_routes = []
        self.glm53_cache = None

        def routed(bsz: Any, cfg: Any, y: Any, params: dict[str, Any]) -> Any:
            selected, weights = routing_fn(bsz, cfg, y, params)
            if params.get("autosplit_measure") or selected.shape[0] != 1:
                return selected, weights
            if self.glm53_cache is not None:
                self.glm53_cache.resolve(selected)
            self.glm53_decode_routes.append(selected.view(-1).tolist())  # a sync a layer: fine for a check
            return selected, weights

        self.routing_fn = routed

    BlockSparseMLP.__init__ = init  # type: ignore[method-assign]

    started = time.perf_counter()
    config = Config.from_directory(args.model)
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=args.cache_tokens)
    model.load()
    print(f"loaded in {time.perf_counter() - started:.1f} s, {len(layers)} MoE layers", flush=True)
    missing = [m.key for m in layers if m.multi_gate is None or m.multi_up is None or m.multi_down is None]
    if not layers or missing:
        print(f"no pointer tables to cache on: {missing or 'no MoE layers'} (an EXL3 model is needed)", flush=True)
        return 3
    generator = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))
    vocab = int(
        json.loads((Path(args.model) / "config.json").read_text()).get("text_config", {}).get("vocab_size", 512)
    )

    def generate() -> tuple[list[list[int]], float]:
        t0 = time.perf_counter()
        tokens = greedy_jobs(generator, args.jobs, args.prompt, args.new, vocab)
        return tokens, time.perf_counter() - t0

    # A first stock run fills the generator's page cache (prefix reuse): the two compared runs then see the same.
    warm_tokens, _ = generate()
    warm_routes = [list(m.glm53_decode_routes) for m in layers]
    for m in layers:
        m.glm53_decode_routes = []
    stock_tokens, stock_s = generate()
    stock_routes = [list(m.glm53_decode_routes) for m in layers]
    for m in layers:
        m.glm53_decode_routes = []
    again_tokens, _ = generate()
    again_routes = [list(m.glm53_decode_routes) for m in layers]
    report: dict[str, Any] = {"args": vars(args), "device": torch.cuda.get_device_name(), "layers": len(layers)}
    counts = [
        np.bincount(np.array(r).ravel(), minlength=int(m.num_experts))
        for r, m in zip(stock_routes, layers, strict=True)
    ]
    rankings = [np.argsort(-c, kind="stable") for c in counts]
    with torch.inference_mode():  # the engine's tables are inference tensors
        for m, ranking in zip(layers, rankings, strict=True):
            m.glm53_decode_routes = []
            m.glm53_cache = LayerExpertCache(m, settings, ranking.tolist(), cache_ext)
    cached_tokens, cached_s = generate()
    cached_routes = [list(m.glm53_decode_routes) for m in layers]
    hits = [int(m.glm53_cache.state[cache_ext.STATE_HITS].item()) for m in layers]
    misses = [int(m.glm53_cache.state[cache_ext.STATE_MISSES].item()) for m in layers]
    overflow = [int(m.glm53_cache.state[cache_ext.STATE_OVERFLOW].item()) for m in layers]
    routes = np.array(cached_routes, dtype=np.int64).transpose(1, 0, 2)  # (steps, layers, top_k)
    experts = int(layers[0].num_experts)
    if args.policy == "frequency":
        simulated = decayed_frequency(
            routes, experts, [args.window] * len(layers), recent=args.recent, half_life=args.half_life
        ).hits.sum(axis=0)
    else:
        simulated = pinned_lru_step_hits(
            routes, experts, np.stack(rankings), [args.pinned] * len(layers), [args.window] * len(layers)
        ).hits.sum(axis=0)

    def first_difference(a: list[list[Any]], b: list[list[Any]]) -> list[int] | None:
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            for j, (u, v) in enumerate(zip(x, y, strict=False)):
                if u != v:
                    return [i, j]
            if len(x) != len(y):
                return [i, min(len(x), len(y))]
        return None

    # every resident slot holds its expert's bytes (the fetch's copies, checked after the run)
    slots_exact = True
    for m in layers:
        c = m.glm53_cache
        for slot, expert in enumerate(c.expert_of.tolist()):
            if expert >= 0:
                slots_exact &= bool(torch.equal(c.pool[slot].cpu(), c.host[expert]))
    report.update(
        {
            "stock_repeatable_tokens": warm_tokens == stock_tokens,
            "stock_again_tokens": again_tokens == stock_tokens,
            "stock_again_routes": again_routes == stock_routes,
            "first_stock_difference": first_difference(stock_tokens, again_tokens),
            "first_warm_difference": first_difference(warm_tokens, stock_tokens),
            "stock_repeatable_routes": warm_routes == stock_routes,
            "first_token_difference": first_difference(stock_tokens, cached_tokens),
            "first_route_difference": first_difference(stock_routes, cached_routes),
            "route_steps": [len(r) for r in stock_routes] + [len(r) for r in cached_routes],
            "slots_hold_their_experts": slots_exact,
            "decode_steps": int(routes.shape[0]),
            "tokens_equal": stock_tokens == cached_tokens,
            "routes_equal": stock_routes == cached_routes,
            "generated_tokens": sum(len(t) for t in cached_tokens),
            "hits": hits,
            "misses": misses,
            "overflow": overflow,
            "simulated_hits": simulated.tolist(),
            "hits_equal_simulator": hits == simulated.tolist(),
            "hit_rate": sum(hits) / max(1, sum(hits) + sum(misses)),
            "stock_seconds": stock_s,
            "cached_seconds": cached_s,
        }
    )
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "args"}), flush=True)
    # Token equality with the stock run is a test only where the stock engine repeats itself: on the H200 two
    # stock runs of the fixture already differ (first at job 0, token 21), so it is reported, not required.
    ok = report["hits_equal_simulator"] and report["slots_hold_their_experts"] and not any(overflow)
    if report["stock_again_tokens"]:
        ok = ok and report["tokens_equal"] and report["routes_equal"]
    print("CACHE IN THE ENGINE: HITS EQUAL TO THE SIMULATOR" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
