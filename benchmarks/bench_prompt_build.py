"""Long prompts cost linear time: building 8K..260K-token prompts, per token, against the 8K baseline.

Exact-length token-id prompts tile the ids of one tokenized base text; needle haystacks join paragraphs whose
token counts are known. The server tokenizes only the short base texts (a constant number of /tokenize calls),
so the table also counts the calls one prompt of each length needs (setup excluded: 1 + 8 calls, once).
A cost per token that stays flat as the length grows 32x is linear work.

    python benchmarks/bench_prompt_build.py [--base-url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console
from rich.table import Table

from glm53.bench.client import BenchClient
from glm53.bench.prompts import PromptFactory
from glm53.bench.runner import completion_body

LENGTHS = (8_192, 32_768, 131_072, 260_096)


class CountingTokenizer:
    """Counts /tokenize calls; delegates to a live server when given one, else a byte-level stand-in."""

    def __init__(self, client: BenchClient | None) -> None:
        self.client = client
        self.calls = 0

    def tokenize(self, model: str, text: str) -> list[int]:
        self.calls += 1
        if self.client is not None:
            return self.client.tokenize(model, text)
        return list(text.encode())


def timed(action: object, repeats: int = 5) -> float:
    assert callable(action)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base-url",
        help="tokenize the base texts on this server instead of a local stand-in",
    )
    args = parser.parse_args()
    client = BenchClient(args.base_url) if args.base_url else None
    model = client.server_info().model if client is not None else "local"
    tokenizer = CountingTokenizer(client)
    factory = PromptFactory(tokenizer, model)
    factory.base_ids()
    factory.paragraph_token_counts()

    table = Table(
        "prompt tokens",
        "exact ids ms",
        "ns/token",
        "vs 8K",
        "request JSON ms",
        "haystack ms",
        "ns/token",
        "vs 8K",
        "/tokenize calls",
        title="prompt building cost per token (best of 5)",
    )
    base_exact = base_hay = 0.0
    for length in LENGTHS:
        before = tokenizer.calls
        factory.exact(length)
        factory.haystack(length, insert="Record for vault x: {}", depth=0.5)
        calls = tokenizer.calls - before
        exact = timed(lambda n=length: factory.exact(n))
        ids = factory.exact(length)
        encode = timed(lambda ids=ids: json.dumps(completion_body(model, ids, 2048, "salt")).encode())
        hay = timed(lambda n=length: factory.haystack(n, insert="Record for vault x: {}", depth=0.5))
        per_exact, per_hay = exact / length * 1e9, hay / length * 1e9
        base_exact, base_hay = base_exact or per_exact, base_hay or per_hay
        table.add_row(
            f"{length:,}",
            f"{exact * 1e3:.2f}",
            f"{per_exact:.1f}",
            f"{per_exact / base_exact:.2f}x",
            f"{encode * 1e3:.1f}",
            f"{hay * 1e3:.2f}",
            f"{per_hay:.1f}",
            f"{per_hay / base_hay:.2f}x",
            str(calls),
        )
    Console(width=160).print(table)
    if client is not None:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
