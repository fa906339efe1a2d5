#!/usr/bin/env python3
"""Record ExLlamaV3's routing while it generates, as a glm53 routing trace, and compare the placement its
dynamic CPU split reaches with glm53's replay of the same rule over the same tokens.

Hooks, on the ExLlamaV3 1.4.6 wheel (499890c), installed after `model.load()`:
- each BlockSparseMLP's `routing_fn` (modules/block_sparse_mlp.py:604-609, called at :1017): wrapped to copy the
  router ids of every forward call (bsz x top_k) before a split layer's map kernel turns them into physical
  slots in place (exllamav3_ext/routing.cu, moe_split_map_kernel / moe_split_issue_kernel);
- `run_pending_swap_sweeps` (modules/block_sparse_mlp_cpu.py:51; called by Generator.on_queue_drained,
  generator/generator.py:457, and inline by `_split_swap_tick`): wrapped to note how many tokens had been
  routed when each sweep ran and how many swaps it made (its `_split_map`s before and after);
- after the run, each split layer's `_split_map` (router id -> physical slot) and `cpu_split_first`: the
  placement the engine holds (CPU-resident = slot >= cpu_split_first).

The engine counts every routed token toward its sweeps' statistics, prompt tokens included, so the replay
takes every token of every call (one step each) and runs sweeps exactly where the engine ran them:
`glm53.plan.policies.exl3_dynamic(..., sweeps=...)` with the same hysteresis, floor and swap cap.

Output under --out:
  routing.npz      the decode tokens (one step a generated token) in glm53's trace format: `glm53 plan simulate`
  tokens.npz       every routed token (prompts too): routes (tokens, layers, top_k), call_sizes, sweep_tokens,
                   sweep_swaps, layers
  compare.json     per split layer: the engine's CPU-resident experts, the replay's, and whether they agree;
                   swaps counted by both; the run's settings

Needs a CUDA machine with ExLlamaV3 1.4.6 (extension built) and glm53 importable (PYTHONPATH=python/src).
Usage: python3 tools/exl3-routing-capture.py --model DIR --out DIR [--split 8] [--interval 8] [--floor 1]
       [--hysteresis 2] [--jobs 6] [--prompt 48] [--new 96]
The fixture has 16 experts and top-8: ExLlamaV3's default floor (8 x the uniform share) can never be cleared
there (docs/plan.md, "The floor"), so the run lowers it through EXL3_MOE_CPU_SWAP_FLOOR to see swaps.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

# `if __name__ == "__main__"` below: ExLlamaV3's CPU worker is a multiprocessing-spawn child.


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--split", type=int, default=8, help="routed experts per layer on the CPU")
    parser.add_argument("--interval", type=int, default=8, help="EXL3_MOE_CPU_SWAP_INTERVAL")
    parser.add_argument("--hysteresis", type=float, default=2.0, help="EXL3_MOE_CPU_SWAP_HYST")
    parser.add_argument("--floor", type=float, default=1.0, help="EXL3_MOE_CPU_SWAP_FLOOR")
    parser.add_argument("--max-swaps", type=int, default=64, help="EXL3_MOE_CPU_SWAP_MAX")
    parser.add_argument("--jobs", type=int, default=6, help="generations, one after another")
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens per generation")
    parser.add_argument("--new", type=int, default=96, help="tokens generated per generation")
    parser.add_argument("--cache-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "EXL3_MOE_CPU_SPLIT": str(args.split),
            "EXL3_MOE_CPU_SWAP": "1",
            "EXL3_MOE_CPU_SWAP_INTERVAL": str(args.interval),
            "EXL3_MOE_CPU_SWAP_HYST": str(args.hysteresis),
            "EXL3_MOE_CPU_SWAP_FLOOR": str(args.floor),
            "EXL3_MOE_CPU_SWAP_MAX": str(args.max_swaps),
            "EXL3_MOE_CPU_PIN": os.environ.get("EXL3_MOE_CPU_PIN", "0"),  # docs/serve.md: the worker's SIGSEGV
        }
    )

    import numpy as np
    import torch
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3.generator import Job
    from exllamav3.generator.sampler import ArgmaxSampler
    from exllamav3.modules import block_sparse_mlp_cpu
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP

    started = time.perf_counter()
    config = Config.from_directory(args.model)
    config.infer_params.moe_cpu_split = args.split
    config.infer_params.moe_cpu_threads = args.threads
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=args.cache_tokens)
    model.load()
    print(f"loaded in {time.perf_counter() - started:.1f} s", flush=True)

    modules = [m for m in model if isinstance(m, BlockSparseMLP)]  # Model.__iter__ (model/model.py:50), load order
    calls: dict[str, list[torch.Tensor]] = {m.key: [] for m in modules}

    for module in modules:
        original = module.routing_fn

        def wrapped(bsz, cfg, y, params, _original=original, _key=module.key):  # type: ignore[no-untyped-def]
            selected, weights = _original(bsz, cfg, y, params)
            calls[_key].append(selected.detach().clone())  # before the map kernel rewrites it in place
            return selected, weights

        module.routing_fn = wrapped

    split = [
        m
        for m in modules
        if getattr(m, "cpu_split_first", None) is not None and getattr(m, "_split_map", None) is not None
    ]
    sweeps: list[tuple[int, int]] = []
    original_sweep = block_sparse_mlp_cpu.run_pending_swap_sweeps

    def routed_tokens() -> int:
        """Tokens of the forward calls every split layer has routed. An inline sweep runs inside the first split
        layer's submit (_split_swap_tick, before its map kernel counts the call), so the call in flight, which
        the last split layer has not routed yet, is not in any layer's counts either."""
        return sum(int(t.shape[0]) for t in calls[split[-1].key]) if split else 0

    def recorded_sweep(infer_params):  # type: ignore[no-untyped-def]
        pending = getattr(infer_params, "moe_cpu_swap_pending", False)
        before = [m._split_map.clone() for m in split]
        tokens = routed_tokens()
        original_sweep(infer_params)
        if pending:
            swaps = sum(int((m._split_map != b).sum().item()) // 2 for m, b in zip(split, before, strict=True))
            sweeps.append((tokens, swaps))

    block_sparse_mlp_cpu.run_pending_swap_sweeps = recorded_sweep
    # _split_swap_tick and the generator import the function by name at call time from the module: patched there

    generator = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))
    vocab = int(
        json.loads((Path(args.model) / "config.json").read_text()).get("text_config", {}).get("vocab_size", 512)
    )
    rng = torch.Generator().manual_seed(22)
    for job_index in range(args.jobs):
        prompt = torch.randint(2, max(3, vocab - 16), (1, args.prompt), generator=rng)
        generator.enqueue(
            Job(
                input_ids=prompt,
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                sampler=ArgmaxSampler(),
                stop_conditions=[],
            )
        )
        while generator.num_remaining_jobs():
            generator.iterate()
        print(f"job {job_index}: {routed_tokens()} tokens routed, {len(sweeps)} sweeps so far", flush=True)
    torch.cuda.synchronize()

    # Modules that never ran (an MTP block's, which plain generation does not call) carry no routing.
    most = max(len(calls[m.key]) for m in modules)
    modules = [m for m in modules if len(calls[m.key]) == most]
    split = [m for m in split if m in modules]
    layers = [int(m.key.split(".layers.")[1].split(".")[0]) for m in modules]
    per_call = [[t.cpu().numpy() for t in calls[m.key]] for m in modules]
    sizes = np.array([c.shape[0] for c in per_call[0]], dtype=np.int64)
    routes = np.stack([np.concatenate(c, axis=0) for c in per_call], axis=1).astype(np.int16)  # (tokens, L, k)
    decode_calls = [i for i, size in enumerate(sizes.tolist()) if size == 1]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    decode = routes[starts[decode_calls]]
    if len(decode_calls) < args.jobs * args.new // 2:
        # A decode step replayed from a captured CUDA graph would not call the Python routing_fn.
        print(
            f"warning: {len(decode_calls)} single-token calls recorded for {args.jobs} x {args.new} generated "
            "tokens: routing_fn did not run for every decode step",
            flush=True,
        )
    experts = int(modules[0].num_experts)
    top_k = int(routes.shape[2])
    header = {"format": "glm53-routing-trace", "version": 1, "layers": layers, "experts": experts, "top_k": top_k}
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), routes=decode)
    (out / "routing.npz").write_bytes(buffer.getvalue())
    sweep_tokens = np.array([t for t, _ in sweeps], dtype=np.int64)
    np.savez(
        out / "tokens.npz",
        routes=routes,
        call_sizes=sizes,
        sweep_tokens=sweep_tokens,
        sweep_swaps=np.array([s for _, s in sweeps], dtype=np.int64),
        layers=np.array(layers),
    )

    from glm53.plan.policies import exl3_dynamic

    split_index = [modules.index(m) for m in split]
    replay = exl3_dynamic(
        routes[:, split_index, :],
        experts,
        [experts - int(m.cpu_split_first) for m in split],
        hysteresis=args.hysteresis,
        floor=args.floor,
        max_swaps=args.max_swaps,
        sweeps=sweep_tokens.tolist(),
    )
    assert replay.final_cpu is not None
    rows = []
    for index, module in enumerate(split):
        mapping = module._split_map.cpu().numpy()
        engine = sorted(np.flatnonzero(mapping >= int(module.cpu_split_first)).tolist())
        simulated = sorted(np.flatnonzero(replay.final_cpu[index]).tolist())
        rows.append(
            {
                "layer": layers[split_index[index]],
                "engine_cpu": engine,
                "replay_cpu": simulated,
                "agree": engine == simulated,
            }
        )
    result = {
        "settings": vars(args),
        "tokens": int(routes.shape[0]),
        "decode_tokens": int(decode.shape[0]),
        "forward_calls": len(sizes),
        "sweeps": len(sweeps),
        "engine_swaps": int(sum(s for _, s in sweeps)),
        "replay_swaps": replay.swaps_between(0),
        "layers_split": len(split),
        "layers_agreeing": sum(row["agree"] for row in rows),
        "layers": rows,
    }
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "layers"}), flush=True)
    for host in (getattr(config, "moe_cpu_hosts", None) or {}).values():
        host.shutdown()
    return 0 if split and result["layers_agreeing"] == len(split) else 1


if __name__ == "__main__":
    sys.exit(main())
