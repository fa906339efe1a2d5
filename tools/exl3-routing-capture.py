#!/usr/bin/env python3
"""Generate with ExLlamaV3's dynamic CPU split while `glm53.serve.engines.exllamav3.routing` records its routing
(the same recorder `glm53 serve --capture-routing` runs inside TabbyAPI), then compare the placement the engine reached
with glm53's replay of the same rule over the same tokens.

The recorder hooks ExLlamaV3 1.4.6 (499890c) when it is imported (its docstring says where): every MoE layer's
router ids with the forward pass of each token, every sweep with its pass, path and swaps per split layer, and
at each queue drain the engine's placement. Here the generator drains after each job, so each job ends with
both files rewritten.

Output under --out:
  capture.npz      the run as `glm53.plan.exllamav3.capture` reads it
  routing.npz      the decode steps every layer routed, in glm53's trace format: `glm53 plan simulate`
  compare.json     `compare_capture`: the sweeps predicted and recorded, swaps per layer, each split layer's
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

    from glm53.plan.exllamav3.capture import compare_capture, decode_trace, load_capture
    from glm53.serve.engines.exllamav3.routing import CAPTURE_NAME, install

    recorder = install(out)  # before ExLlamaV3 is imported: the hooks go in as it is

    import torch
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3.generator import Job
    from exllamav3.generator.sampler import ArgmaxSampler

    started = time.perf_counter()
    config = Config.from_directory(args.model)
    config.infer_params.moe_cpu_split = args.split
    config.infer_params.moe_cpu_threads = args.threads
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=args.cache_tokens)
    model.load()
    print(f"loaded in {time.perf_counter() - started:.1f} s", flush=True)

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
            generator.iterate()  # the last iteration drains the queue: the recorder writes both files
        print(
            f"job {job_index}: {recorder.passes} forward passes, {len(recorder.sweep_calls)} sweeps so far, "
            f"{len(recorder.drained_after)} drains",
            flush=True,
        )
    torch.cuda.synchronize()

    capture = load_capture(out / CAPTURE_NAME)
    steps = decode_trace(capture).steps
    if steps < args.jobs * args.new // 2:
        # A decode step replayed from a captured CUDA graph would not call the Python routing_fn.
        print(f"warning: {steps} one-token passes for {args.jobs} x {args.new} generated tokens", flush=True)
    result = compare_capture(capture)
    (out / "compare.json").write_text(result.model_dump_json(indent=1))
    summary = result.model_dump(exclude={"layers", "predicted_sweeps", "recorded_sweeps"})
    print(json.dumps({"settings": vars(args), "decode_steps": steps, **summary}), flush=True)
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
