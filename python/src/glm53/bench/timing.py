"""Is a stream's timing physically possible? A server (or a proxy) that holds a stream back and releases it in
one burst makes the decode rate measured at the client absurd: 2,048 tokens in 1 ms read as 2 million tok/s,
and a best-of-N would publish it. A run whose timing fails one of these checks is invalid, with the reason.

The bounds, and why:

- `MAX_DECODE_TOK_S` = 20,000 tokens/s for one sequence. Each decode step of a transformer reads every active
  weight once: even a 1 GB model on the fastest HBM (H200, 4.8 TB/s) needs 0.2 ms a step, and vLLM's own
  per-step work (schedule, sample, detokenize, stream) costs more than that. The fastest published
  single-stream rates, speculative decoding on dedicated hardware included, stay below 3,000 tok/s. A
  sustained rate above 20,000 tok/s is a buffered stream, not an engine.
- `MIN_EVENT_GAP_S` = 0.25 ms between two events carrying tokens. vLLM sends at most one event per engine
  step per request (several tokens of one step share an event), and no engine step is that short (see
  above). When more than `MAX_BURST_SHARE` (half) of a stream's token events arrive faster than that after
  the previous one, the stream was released in bursts: by the server, a proxy, or this host being too busy
  to read its socket (the measurement is wrong either way).
- Both need `MIN_TOKENS` (32) generated tokens: on a shorter run one late read of the socket moves the rate
  by more than any bound, so it says nothing.
- The engine's own timings, from `/metrics` around the request (`vllm:request_decode_time_seconds`,
  `vllm:time_to_first_token_seconds`): when exactly one request finished meanwhile (ours), the decode window
  the client saw must be at least half the engine's (less `JITTER_S`, 10 ms), and the first token may not
  arrive later than twice the engine's TTFT plus `LATE_FIRST_TOKEN_S` (2 s, for the HTTP request and
  response on a busy host).
"""

from __future__ import annotations

import itertools

from glm53.bench.metrics import MetricsDelta
from glm53.bench.stream import StreamOutcome

MAX_DECODE_TOK_S = 20_000.0
MIN_EVENT_GAP_S = 0.000_25
MAX_BURST_SHARE = 0.5
MIN_TOKENS = 32
JITTER_S = 0.010
LATE_FIRST_TOKEN_S = 2.0
# Every reason below starts so: the runner retries such runs, reports count them.
IMPLAUSIBLE = "implausible timing"


def implausible_timing(outcome: StreamOutcome, metrics: MetricsDelta | None) -> str | None:
    """Why the stream's timing cannot be an engine's (None when it can, or when nothing can be told)."""
    usage, first, end = outcome.usage, outcome.ttft_s, outcome.end_s
    if usage is None or first is None or end is None or end <= first:
        return None
    tokens = usage.completion_tokens
    window = end - first
    if tokens >= MIN_TOKENS:
        rate = (tokens - 1) / window
        if rate > MAX_DECODE_TOK_S:
            return (
                f"{IMPLAUSIBLE}: {tokens - 1} tokens decoded in {window * 1000:.3g} ms ({rate:,.0f} tok/s, "
                f"above the {MAX_DECODE_TOK_S:,.0f} tok/s no engine reaches on one sequence): the stream was "
                "held back and released in a burst"
            )
        times = outcome.token_times_s
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        bursts = sum(1 for gap in gaps if gap < MIN_EVENT_GAP_S)
        if len(gaps) >= MIN_TOKENS - 1 and bursts > MAX_BURST_SHARE * len(gaps):
            return (
                f"{IMPLAUSIBLE}: {bursts} of {len(gaps)} token events arrived less than "
                f"{MIN_EVENT_GAP_S * 1000:g} ms after the previous one (faster than any engine step): the stream "
                "was released in bursts (by the server, a proxy, or this host too busy to read it)"
            )
    return _disagreement(outcome, metrics, tokens, first, window)


def _disagreement(
    outcome: StreamOutcome, metrics: MetricsDelta | None, tokens: int, first: float, window: float
) -> str | None:
    """The client's times against the engine's, when /metrics shows exactly our request finishing."""
    if metrics is None or metrics.server_requests != 1:
        return None
    decode = metrics.server_decode_s
    if decode is not None and decode > 0 and window < decode / 2 - JITTER_S:
        server_rate = (tokens - 1) / decode if tokens > 1 else 0.0
        client_rate = (tokens - 1) / window if tokens > 1 else 0.0
        return (
            f"{IMPLAUSIBLE}: the engine decoded for {decode:.3f} s ({server_rate:,.1f} tok/s, "
            f"vllm:request_decode_time_seconds) but the tokens reached this client within {window:.3f} s "
            f"({client_rate:,.1f} tok/s): the stream was held back and released in bursts"
        )
    ttft = metrics.server_ttft_s
    if ttft is not None and ttft >= 0 and first > 2 * ttft + LATE_FIRST_TOKEN_S:
        return (
            f"{IMPLAUSIBLE}: the engine produced the first token after {ttft:.3f} s "
            f"(vllm:time_to_first_token_seconds) but it reached this client after {first:.3f} s: the stream "
            "was held back"
        )
    return None


def server_decode_rate(outcome: StreamOutcome, metrics: MetricsDelta | None) -> float | None:
    """The engine's own decode rate for this request, (completion tokens - 1) / its decode time, when /metrics
    shows exactly one request finishing meanwhile."""
    if metrics is None or metrics.server_requests != 1 or outcome.usage is None:
        return None
    decode = metrics.server_decode_s
    if decode is None or decode <= 0 or outcome.usage.completion_tokens < 2:
        return None
    return (outcome.usage.completion_tokens - 1) / decode
