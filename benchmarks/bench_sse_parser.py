"""The bench client is never the bottleneck: how many streamed tokens per second it can take in.

Three ways of consuming the same vLLM-shaped completion stream (one token per event, as vLLM sends it):

- in memory: SSE parsing alone, then parsing + JSON + stream accounting (everything but the network);
- over loopback HTTP from a local server writing events as fast as it can: a raw byte read (the baseline, the
  transport's own ceiling) and the full `BenchClient.stream` path.

The headroom column divides each rate by the fastest decode rate the benchmark has to time: the recipe's best
published decode rate, and (with --base-url) a decode rate measured live on a server. The client passes when
the full path over HTTP has at least 20x headroom over every reference rate.

    python benchmarks/bench_sse_parser.py [--events 20000] [--base-url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from rich.console import Console
from rich.table import Table

from glm53.bench.client import BenchClient
from glm53.bench.sse import SSEParser
from glm53.bench.stream import StreamAccumulator
from glm53.recipe.performance import recipe_performance

REQUIRED_HEADROOM = 20.0


def vllm_like_events(count: int) -> list[bytes]:
    """Events shaped like vLLM 0.32's /v1/completions stream (same keys, same sizes)."""
    events = []
    for i in range(count):
        finish = "length" if i == count - 1 else None
        chunk = {
            "id": "cmpl-9f1c2d3e4b5a6978",
            "object": "text_completion",
            "created": 1795996938,
            "model": "GLM-5.3-Flash",
            "choices": [
                {
                    "index": 0,
                    "text": f" tok{i % 997}",
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_token_ids": None,
                    "token_ids": None,
                }
            ],
        }
        events.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    usage = {
        "id": "cmpl-9f1c2d3e4b5a6978",
        "object": "text_completion",
        "created": 1795996938,
        "model": "GLM-5.3-Flash",
        "choices": [],
        "usage": {
            "prompt_tokens": 8192,
            "total_tokens": 8192 + count,
            "completion_tokens": count,
        },
    }
    events.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def parse_only(events: list[bytes]) -> float:
    parser = SSEParser()
    started = time.perf_counter()
    seen = 0
    for event in events:
        seen += len(parser.feed(event))
    elapsed = time.perf_counter() - started
    assert seen == len(events)
    return elapsed


def parse_and_account(events: list[bytes]) -> float:
    parser = SSEParser()
    accumulator = StreamAccumulator()
    started = time.perf_counter()
    for event in events:
        accumulator.feed(parser.feed(event), time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    outcome = accumulator.outcome(end_s=elapsed, http_status=200)
    assert outcome.error is None and outcome.token_events == len(events) - 2, outcome.error
    return elapsed


def serve(events: list[bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in events:  # one write per event, as vLLM flushes them
                self.wfile.write(event)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def raw_read(url: str) -> float:
    with httpx.Client() as client:
        started = time.perf_counter()
        with client.stream("POST", url, json={}) as response:
            for _ in response.iter_bytes():
                pass
        return time.perf_counter() - started


def full_client(url: str, tokens: int) -> float:
    with BenchClient(url) as client:
        started = time.perf_counter()
        outcome = client.stream("/v1/completions", {"prompt": [1]})
        elapsed = time.perf_counter() - started
    assert outcome.error is None and outcome.usage is not None, outcome.error
    assert outcome.usage.completion_tokens == tokens and outcome.token_events == tokens
    return elapsed


def best(runs: Iterator[float]) -> float:
    return min(runs)


def live_decode_rate(base_url: str) -> float:
    from glm53.bench.prompts import PromptFactory
    from glm53.bench.runner import Shape, run_benchmark

    with BenchClient(base_url, timeout_s=600) as client:
        info = client.server_info()
        section = run_benchmark(
            client,
            PromptFactory(client, info.model),
            info.model,
            [Shape(prompt_tokens=128, output_tokens=256)],
            runs=3,
        )
    rate = section.shapes[0].best.decode_tok_s
    if rate is None:
        raise SystemExit(f"no valid run against {base_url}: {section.shapes[0].runs[0].invalid_reason}")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000, help="tokens (events) per stream")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--base-url", help="also measure a live server's decode rate as a reference")
    args = parser.parse_args()

    events = vllm_like_events(args.events)
    tokens = args.events
    references = {
        "recipe best decode": max(p.decode_tok_s for pts in recipe_performance().profiles.values() for p in pts)
    }
    if args.base_url:
        references[f"measured decode ({args.base_url})"] = live_decode_rate(args.base_url)

    server = serve(events)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        rows = {
            "SSE parse only (memory)": best(parse_only(events) for _ in range(args.repeats)),
            "parse + JSON + accounting (memory)": best(parse_and_account(events) for _ in range(args.repeats)),
            "raw byte read over HTTP (baseline)": best(raw_read(url + "/v1/completions") for _ in range(args.repeats)),
            "BenchClient.stream over HTTP": best(full_client(url, tokens) for _ in range(args.repeats)),
        }
    finally:
        server.shutdown()
        server.server_close()

    baseline = tokens / rows["raw byte read over HTTP (baseline)"]
    table = Table(
        "path",
        "tokens/s",
        "vs raw read",
        *(f"headroom vs {name}" for name in references),
        title=f"{tokens:,} streamed tokens, {sum(map(len, events)) / 1e6:.1f} MB, best of {args.repeats}",
    )
    for name, seconds in rows.items():
        rate = tokens / seconds
        table.add_row(
            name,
            f"{rate:,.0f}",
            f"{rate / baseline:.2f}x",
            *(f"{rate / ref:,.0f}x" for ref in references.values()),
        )
    console = Console(width=160)
    console.print(table)
    for name, ref in references.items():
        console.print(f"reference: {name} = {ref:,.1f} tok/s")
    client_rate = tokens / rows["BenchClient.stream over HTTP"]
    worst = min(client_rate / ref for ref in references.values())
    verdict = "PASS" if worst >= REQUIRED_HEADROOM else "FAIL"
    console.print(f"{verdict}: the full client path has {worst:,.0f}x headroom (required {REQUIRED_HEADROOM:g}x)")
    return 0 if worst >= REQUIRED_HEADROOM else 1


if __name__ == "__main__":
    sys.exit(main())
