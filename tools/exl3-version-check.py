#!/usr/bin/env python3
"""One ExLlamaV3 install on the tiny GLM-5.3 fixture: what the expert cache and the planner rely on, and its speed.

Prints one JSON line: the version; whether GLM-5.3's architecture accepts tensor parallelism (`supports_tp`);
whether every MoE layer, once loaded, exposes the pointer tables the cache rewrites
(`multi_gate/up/down.ptrs_trellis`, kLong, one entry an expert); the load time; and the GPU-only greedy decode
rate over --jobs jobs of --new tokens (the first job warms up and is not counted). Run it once per install, in
one call, to compare releases on the same GPU (tools/exl3-gpu-run.sh stage version-check).

    python3 tools/exl3-version-check.py --model DIR [--jobs 4] [--new 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--new", type=int, default=128)
    args = parser.parse_args()

    import exllamav3
    import torch
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3 import version as exllamav3_version
    from exllamav3.generator import Job
    from exllamav3.generator.sampler import ArgmaxSampler
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP

    report: dict[str, Any] = {
        # the imported package's own version file, not installed metadata: two releases sit on one path here
        "exllamav3": exllamav3_version.__version__,
        "exllamav3_path": exllamav3.__file__,
        "device": torch.cuda.get_device_name(),
    }
    started = time.perf_counter()
    config = Config.from_directory(args.model)
    report["architecture"] = type(config).__name__
    model = Model.from_config(config)
    report["supports_tp"] = bool(model.caps.get("supports_tp", False))  # the architecture's caps (glm5_next.py)
    cache = Cache(model, max_num_tokens=4096)
    model.load()
    report["load_seconds"] = round(time.perf_counter() - started, 2)
    moe = [m for m in model if isinstance(m, BlockSparseMLP)]  # Model iterates every module, nested ones too
    tables = []
    for m in moe:
        ok = all(
            getattr(getattr(m, name, None), "ptrs_trellis", None) is not None
            and getattr(m, name).ptrs_trellis.dtype == torch.long
            and getattr(m, name).ptrs_trellis.numel() == int(m.num_experts)
            for name in ("multi_gate", "multi_up", "multi_down")
        )
        tables.append(ok)
    report["moe_layers"] = len(moe)
    report["pointer_tables"] = bool(moe) and all(tables)
    generator = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))
    vocab = int(
        json.loads((Path(args.model) / "config.json").read_text()).get("text_config", {}).get("vocab_size", 512)
    )
    rng = torch.Generator().manual_seed(5)
    rates = []
    for index in range(args.jobs):
        prompt = torch.randint(2, max(3, vocab - 16), (1, 32), generator=rng)
        generator.enqueue(
            Job(input_ids=prompt, max_new_tokens=args.new, min_new_tokens=args.new, sampler=ArgmaxSampler(),
                stop_conditions=[], identifier=index)
        )  # fmt: skip
        tokens, first = 0, None
        while generator.num_remaining_jobs():
            for result in generator.iterate():
                if result.get("stage") == "streaming" and "token_ids" in result:
                    tokens += int(result["token_ids"].numel())
                    if first is None:
                        torch.cuda.synchronize()
                        first = time.perf_counter()
        torch.cuda.synchronize()
        if index and first is not None and tokens > 1:
            rates.append((tokens - 1) / (time.perf_counter() - first))
    report["decode_tok_s"] = [round(r, 1) for r in rates]
    report["decode_tok_s_median"] = round(sorted(rates)[len(rates) // 2], 1) if rates else None
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
