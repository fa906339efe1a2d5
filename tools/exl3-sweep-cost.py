#!/usr/bin/env python3
"""Time what one ExLlamaV3 1.4.6 placement sweep costs before any swap, at GLM-5.3's shape, on a CUDA machine.

A sweep (`run_pending_swap_sweeps` in `exllamav3/modules/block_sparse_mlp_cpu.py` at 499890c) synchronizes
every device, then gives each split layer a turn (`_split_sweep_layer`): it copies the layer's placement map
and counts to the host, walks every expert in Python, sorts both sides and halves the counts. That work grows
with the layers and the experts, so the EXL3 fixture (5 split layers of 16 experts) cannot show it at the
model's 42 layers of 256. Here the engine's own two functions run, unchanged, over a registry of layer objects
that hold what a sweep reads (map, counts on the GPU, the split point, the device): counts equal, so that no
pair clears the hysteresis and no swap is made. A swap's own cost is measured by the routing stage's timed
captures (`engine_cost.SWAP_OVERHEAD_SECONDS`).

Prints, and writes to --out as JSON, the seconds of a sweep for every (layers, experts) pair asked for.
Needs ExLlamaV3 1.4.6 importable with its extension built (tools/exl3-gpu-run.sh stages setup build).
Usage: python3 tools/exl3-sweep-cost.py --out FILE [--layers 1,5,42] [--experts 16,64,256] [--repeats 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path


def registry(module: types.ModuleType, layers: int, experts: int, device: object) -> list[object]:
    """Layer objects carrying the state `_split_sweep_layer` reads, with the engine's methods bound to them."""
    import torch

    engine_class = module.BlockSparseMLP_CPU
    layer_objects = []
    for index in range(layers):
        layer = types.SimpleNamespace(
            key=f"model.layers.{index}.mlp",
            num_experts=experts,
            cpu_split_first=experts // 4,  # a quarter on the GPU, the rest on the CPU worker
            device=device,
            _split_map=torch.arange(experts, dtype=torch.long, device=device),
            _split_hist=torch.full((experts,), 3.0, dtype=torch.float, device=device),
            _swap_tick_count=0,
        )
        for name in ("_split_sweep_layer", "_split_sweep_layer_reset", "_split_swap_experts"):
            setattr(layer, name, types.MethodType(getattr(engine_class, name), layer))
        layer_objects.append(layer)
    return layer_objects


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", default="1,5,42")
    parser.add_argument("--experts", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()

    import torch
    from exllamav3.modules import block_sparse_mlp_cpu as module

    device = torch.device("cuda", 0)
    results = []
    for layers in (int(value) for value in args.layers.split(",")):
        for experts in (int(value) for value in args.experts.split(",")):
            layer_objects = registry(module, layers, experts, device)
            params = types.SimpleNamespace(moe_cpu_swap_modules=layer_objects, moe_cpu_swap_pending=False)
            seconds = []
            for _ in range(args.repeats + 2):
                for layer in layer_objects:  # counts as the decode steps left them (halved by every turn)
                    layer._split_hist.fill_(3.0)
                torch.cuda.synchronize(device)
                params.moe_cpu_swap_pending = True
                start = time.perf_counter()
                module.run_pending_swap_sweeps(params)
                seconds.append(time.perf_counter() - start)
            seconds = seconds[2:]  # the first two warm the allocator and the interpreter's caches
            row = {
                "layers": layers,
                "experts": experts,
                "repeats": len(seconds),
                "median_s": statistics.median(seconds),
                "min_s": min(seconds),
                "p90_s": sorted(seconds)[int(0.9 * (len(seconds) - 1))],
            }
            results.append(row)
            print(
                f"layers {layers:3d} experts {experts:4d}: median {row['median_s'] * 1e3:8.3f} ms "
                f"min {row['min_s'] * 1e3:8.3f} p90 {row['p90_s'] * 1e3:8.3f}",
                flush=True,
            )
    report = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "sweeps": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
