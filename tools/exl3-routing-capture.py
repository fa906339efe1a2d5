#!/usr/bin/env python3
"""Record ExLlamaV3's routing while it generates, as a glm53 routing trace, and compare the placement its
dynamic CPU split reaches with glm53's replay of the same rule over the same tokens.

Hooks, on the ExLlamaV3 1.4.6 wheel (499890c), installed after `model.load()`:
- each BlockSparseMLP's `routing_fn` (modules/block_sparse_mlp.py:604-609, called at :1017): wrapped to copy the
  router ids of every forward call (bsz x top_k) before a split layer's map kernel turns them into physical
  slots in place (exllamav3_ext/routing.cu, moe_split_map_kernel / moe_split_issue_kernel);
- `run_pending_swap_sweeps` (modules/block_sparse_mlp_cpu.py:51; called by Generator.on_queue_drained,
  generator/generator.py:457, and inline by `_split_swap_tick`): wrapped to note the forward pass each sweep
  came before, whether it ran inline, and the swaps each split layer made (its `_split_map` before and after);
- after the run, each split layer's `_split_map` (router id -> physical slot) and `cpu_split_first`: the
  placement the engine holds (CPU-resident = slot >= cpu_split_first).

Each layer's routing is kept with the forward pass of every token: the engine counts every token a layer routes,
prompt tokens included, and its prefill stops at the last layer's attention, so the last layer sees decode steps
only. `glm53.plan.exl3_capture.compare_capture` replays the rule over exactly those tokens and predicts the
sweeps from the passes and the drains alone.

Output under --out:
  capture.npz      the run as `glm53.plan.exl3_capture` reads it (every layer's tokens, the sweeps, the
                   engine's swaps per layer and its final placement)
  routing.npz      the decode steps every layer routed, in glm53's trace format: `glm53 plan simulate`
  compare.json     the comparison: the sweeps predicted and recorded, swaps per layer, each split layer's
                   CPU-resident experts by the engine and by the replay

Exit 0 when the replay agrees with the engine in every part, 1 when it does not.
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
    first = modules[0].key  # the first MoE layer runs in every forward pass: its calls number the passes
    calls: dict[str, list[torch.Tensor]] = {m.key: [] for m in modules}
    call_index: dict[str, list[int]] = {m.key: [] for m in modules}

    for module in modules:
        original = module.routing_fn

        def wrapped(bsz, cfg, y, params, _original=original, _key=module.key):  # type: ignore[no-untyped-def]
            selected, weights = _original(bsz, cfg, y, params)
            # the pass this call belongs to: the first layer's call opens it, later layers join it
            call_index[_key].append(len(calls[first]) if _key == first else len(calls[first]) - 1)
            calls[_key].append(selected.detach().clone())  # before the map kernel rewrites it in place
            return selected, weights

        module.routing_fn = wrapped

    registry = list(getattr(config.infer_params, "moe_cpu_swap_modules", None) or [])  # the sweep's own order
    sweep_calls: list[int] = []
    sweep_inline: list[bool] = []
    sweep_swaps: list[list[int]] = []
    original_sweep = block_sparse_mlp_cpu.run_pending_swap_sweeps

    def recorded_sweep(infer_params):  # type: ignore[no-untyped-def]
        pending = getattr(infer_params, "moe_cpu_swap_pending", False)
        # _split_swap_tick sweeps inline only at 4 x interval ticks, inside the first split layer's submit of
        # a pass whose routing has run but is not yet counted; a drained sweep runs between passes
        inline = bool(registry) and registry[0]._swap_tick_count >= 4 * args.interval
        before = [m._split_map.clone() for m in registry]
        passes = len(calls[first])
        original_sweep(infer_params)
        if pending:
            sweep_calls.append(passes - 1 if inline else passes)
            sweep_inline.append(inline)
            sweep_swaps.append(
                [int((m._split_map != b).sum().item()) // 2 for m, b in zip(registry, before, strict=True)]
            )

    block_sparse_mlp_cpu.run_pending_swap_sweeps = recorded_sweep
    # _split_swap_tick and the generator import the function by name at call time from the module: patched there

    generator = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))
    vocab = int(
        json.loads((Path(args.model) / "config.json").read_text()).get("text_config", {}).get("vocab_size", 512)
    )
    rng = torch.Generator().manual_seed(22)
    drained_after: list[int] = []
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
        drained_after.append(len(calls[first]) - 1)  # Generator.on_queue_drained ran after this pass
        print(f"job {job_index}: {len(calls[first])} forward passes, {len(sweep_calls)} sweeps so far", flush=True)
    torch.cuda.synchronize()

    from glm53.plan.exl3_capture import CapturedLayer, Exl3Capture, compare_capture, save_capture

    def layer_number(module) -> int:  # type: ignore[no-untyped-def]
        return int(module.key.split(".layers.")[1].split(".")[0])

    # A module that never ran (an MTP block's, which plain generation does not call) carries no routing.
    ran = [m for m in modules if calls[m.key]]
    captured = tuple(
        CapturedLayer(
            layer_number(m),
            torch.cat(calls[m.key]).cpu().numpy().astype(np.int16),
            np.repeat(np.array(call_index[m.key]), [int(t.shape[0]) for t in calls[m.key]]),
        )
        for m in ran
    )
    split = [m for m in registry if calls[m.key]]
    experts = int(modules[0].num_experts)
    capture = Exl3Capture(
        experts=experts,
        interval=args.interval,
        hysteresis=args.hysteresis,
        floor=args.floor,
        max_swaps=args.max_swaps,
        calls=len(calls[first]),
        drained_after=tuple(drained_after),
        layers=captured,
        split_layers=tuple(layer_number(m) for m in split),
        cpu_experts=tuple(experts - int(m.cpu_split_first) for m in split),
        sweep_calls=tuple(sweep_calls),
        sweep_inline=tuple(sweep_inline),
        sweep_swaps=np.array([[row[registry.index(m)] for m in split] for row in sweep_swaps], dtype=np.int64).reshape(
            len(sweep_swaps), len(split)
        ),
        engine_cpu=np.array(
            [m._split_map.cpu().numpy() >= int(m.cpu_split_first) for m in split], dtype=np.bool_
        ).reshape(len(split), experts),
    )
    (out / "capture.npz").write_bytes(save_capture(capture))

    # The decode steps (one-token passes) that every layer routed, as a glm53 trace.
    singles = [
        {c: i for i, (c, t) in enumerate(zip(call_index[m.key], calls[m.key], strict=True)) if t.shape[0] == 1}
        for m in ran
    ]
    steps = sorted(set.intersection(*(set(s) for s in singles)))
    if len(steps) < args.jobs * args.new // 2:
        # A decode step replayed from a captured CUDA graph would not call the Python routing_fn.
        print(f"warning: {len(steps)} one-token passes for {args.jobs} x {args.new} generated tokens", flush=True)
    decode = np.stack(
        [np.stack([calls[m.key][s[c]][0].cpu().numpy() for c in steps]) for m, s in zip(ran, singles, strict=True)],
        axis=1,
    ).astype(np.int16)  # (steps, layers, top_k)
    header = {
        "format": "glm53-routing-trace",
        "version": 1,
        "layers": [layer_number(m) for m in ran],
        "experts": experts,
        "top_k": int(decode.shape[2]),
    }
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), routes=decode)
    (out / "routing.npz").write_bytes(buffer.getvalue())

    result = compare_capture(capture)
    (out / "compare.json").write_text(result.model_dump_json(indent=1))
    summary = result.model_dump(exclude={"layers", "predicted_sweeps", "recorded_sweeps"})
    print(json.dumps({"settings": vars(args), "decode_steps": len(steps), **summary}), flush=True)
    for row in result.layers:
        print(
            f"layer {row.layer}: {row.tokens} tokens, swaps engine {row.engine_swaps} replay {row.replay_swaps}, "
            f"CPU engine {row.engine_cpu} replay {row.replay_cpu}",
            flush=True,
        )
    for host in (getattr(config, "moe_cpu_hosts", None) or {}).values():
        host.shutdown()
    return 0 if result.agree else 1


if __name__ == "__main__":
    sys.exit(main())
