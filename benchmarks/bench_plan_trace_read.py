"""Reading a routing trace: the JSONL form against the binary (.npz) form, in the same process.

A synthetic trace of GLM-5.3-Flash's shape (42 MoE layers x 288 experts, top-8), 100,000 decode steps by default
(the JSONL is about 130 MB), written in both forms, then each read `--repeats` times with the same validation
(ids in range, distinct per step and layer, shape matching the header). Prints the best time of each and the ratio.

    python benchmarks/bench_plan_trace_read.py [--steps N] [--repeats N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from glm53.plan.routing.traces import SyntheticTraceSpec, read_trace, synthesize_trace, write_trace


def _best(path: Path, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        read_trace(path)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, help="where to write the two traces (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        trace = synthesize_trace(SyntheticTraceSpec(steps=args.steps))
        jsonl, binary = folder / "trace.jsonl", folder / "trace.npz"
        write_trace(jsonl, trace)
        write_trace(binary, trace)
        assert np.array_equal(read_trace(binary).routes, read_trace(jsonl).routes)
        text_s, binary_s = _best(jsonl, args.repeats), _best(binary, args.repeats)
        print(f"{args.steps:,} steps x 42 layers x top-8")
        print(f"JSONL  {jsonl.stat().st_size / 1e6:8.1f} MB  read + validate {text_s:7.3f} s")
        print(f".npz   {binary.stat().st_size / 1e6:8.1f} MB  read + validate {binary_s:7.3f} s")
        print(f"ratio: the binary form reads {text_s / binary_s:.0f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
