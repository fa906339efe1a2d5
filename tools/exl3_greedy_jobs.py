"""Greedy generation jobs on ExLlamaV3 1.4.6's Generator, the same prompts every call: what
tools/exl3-cache-generate.py and tools/exl3-host-experts-check.py run the engine with (imported from their folder)."""

from __future__ import annotations

from typing import Any


def greedy_jobs(generator: Any, jobs: int, prompt_tokens: int, new_tokens: int, vocab: int) -> list[list[int]]:
    """`jobs` jobs one after another, each a seeded random prompt of `prompt_tokens` ids, `new_tokens` argmax tokens
    each; returns each job's generated ids, the GPU synchronized."""
    import torch  # heavy: only on the GPU machine
    from exllamav3.generator import Job  # heavy: the engine
    from exllamav3.generator.sampler import ArgmaxSampler  # heavy: the engine

    rng = torch.Generator().manual_seed(5)
    tokens: list[list[int]] = []
    for index in range(jobs):
        prompt = torch.randint(2, max(3, vocab - 16), (1, prompt_tokens), generator=rng)
        generator.enqueue(
            Job(
                input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, sampler=ArgmaxSampler(),
                stop_conditions=[], identifier=index,
            )
        )  # fmt: skip
        out: list[int] = []
        while generator.num_remaining_jobs():
            for result in generator.iterate():
                if result.get("stage") == "streaming" and "token_ids" in result:
                    out += result["token_ids"].view(-1).tolist()
        tokens.append(out)
    torch.cuda.synchronize()
    return tokens
