"""vLLM's `/metrics` (Prometheus text format): parse, and diff two snapshots around a request."""

from __future__ import annotations

import math
import re
import time
from typing import Protocol

from pydantic import BaseModel, Field

# name, optional {labels}, value; an optional timestamp follows. Label values may hold spaces and braces,
# so the labels group is matched up to the last "}" before the value.
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of each metric name over its label sets (one engine, one model: the sum is it)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):
            # NaN or +/-Inf: no counter of ours is ever one, and one would poison every difference.
            continue
        name = match.group(1)
        totals[name] = totals.get(name, 0.0) + value
    return totals


class MetricsDelta(BaseModel):
    """Counter increases between two snapshots; None where the server does not export the counter."""

    preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    # The engine's own timings (histogram sums and counts), to check the times this client saw against them.
    server_requests: float | None = Field(
        None, description="requests whose decode finished (vllm:request_decode_time_seconds count)"
    )
    server_decode_s: float | None = Field(None, description="first -> last token, as the engine timed it")
    server_ttft_s: float | None = Field(None, description="arrival -> first token, as the engine timed it")

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


_COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "server_requests": "vllm:request_decode_time_seconds_count",
    "server_decode_s": "vllm:request_decode_time_seconds_sum",
    "server_ttft_s": "vllm:time_to_first_token_seconds_sum",
}


def _counter(sample: dict[str, float], base: str) -> float | None:
    # prometheus_client exports counters with a `_total` suffix; older exporters did not.
    for name in (f"{base}_total", base):
        if name in sample:
            return sample[name]
    return None


def diff_metrics(before: dict[str, float] | None, after: dict[str, float] | None) -> MetricsDelta | None:
    if before is None or after is None:
        return None
    values: dict[str, float | None] = {}
    for field, base in _COUNTERS.items():
        start, end = _counter(before, base), _counter(after, base)
        values[field] = None if start is None or end is None else max(0.0, end - start)
    return MetricsDelta(**values)


class MetricsSource(Protocol):
    def metrics_text(self) -> str | None: ...


def snapshot(source: MetricsSource) -> dict[str, float] | None:
    """The server's counters now, or None when it exports none."""
    text = source.metrics_text()
    return parse_prometheus(text) if text is not None else None


# How long to wait for the engine to count a request whose stream has ended: vLLM records a finished request's
# stats just after it hands the last output to the HTTP side, so a /metrics read at once can precede it.
SETTLE_S = 2.0
_SETTLE_POLL_S = 0.05


def delta_after(
    source: MetricsSource, before: dict[str, float] | None, *, finished: bool, settle_s: float = SETTLE_S
) -> tuple[dict[str, float] | None, MetricsDelta | None]:
    """(the counters now, their increase since `before`). When the request `finished` (a complete stream), once
    the engine has counted it: while no finished request shows yet, /metrics is read again, for `settle_s` at
    most. A request that failed is not waited for (the engine may never have seen it)."""
    after = snapshot(source)
    delta = diff_metrics(before, after)
    deadline = time.monotonic() + settle_s
    while finished and delta is not None and delta.server_requests == 0 and time.monotonic() < deadline:
        time.sleep(_SETTLE_POLL_S)
        after = snapshot(source)
        delta = diff_metrics(before, after)
    return after, delta
