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

What the checks reject is the client's clock, not the engine: a busy CPU engine coalesces several steps'
output into one event, a proxy buffers. When `/metrics` shows exactly our request finishing, the engine's own
timings for it are the measurement instead (`settle_timing`, source "server": TTFT = its
`vllm:time_to_first_token_seconds`, decode = (completion tokens - 1) / its `vllm:request_decode_time_seconds`),
provided its own rate is below `MAX_DECODE_TOK_S` too. Only a run that neither source can vouch for is
invalid.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

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

# Whose clock a run's TTFT and rates come from: this client's (the stream as it arrived) or the engine's own
# per-request timings from /metrics (when the stream's arrival cannot be an engine's).
TimingSource = Literal["client", "server"]


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


@dataclass(frozen=True)
class EngineTiming:
    """The engine's own timings of one request, from /metrics."""

    ttft_s: float
    decode_s: float
    decode_tok_s: float
    prefill_tok_s: float | None


def engine_timing(outcome: StreamOutcome, metrics: MetricsDelta | None) -> EngineTiming | str:
    """The engine's timings of this request, or why /metrics cannot give them."""
    if metrics is None:
        return "the server exports no /metrics"
    if metrics.server_requests is None or metrics.server_decode_s is None or metrics.server_ttft_s is None:
        return "its /metrics have no vllm:request_decode_time_seconds or vllm:time_to_first_token_seconds"
    if metrics.server_requests != 1:
        return (
            f"{metrics.server_requests:g} requests finished on the engine meanwhile, not this one alone (other traffic)"
        )
    usage = outcome.usage
    if usage is None or usage.completion_tokens < 2:
        return "fewer than two tokens: no decode to time"
    decode, ttft = metrics.server_decode_s, metrics.server_ttft_s
    if decode <= 0 or ttft <= 0:
        return f"the engine timed its decode at {decode:g} s and its first token at {ttft:g} s"
    rate = (usage.completion_tokens - 1) / decode
    if rate > MAX_DECODE_TOK_S:
        return f"the engine's own rate, {rate:,.0f} tok/s, is above {MAX_DECODE_TOK_S:,.0f} tok/s too"
    return EngineTiming(
        ttft_s=ttft,
        decode_s=decode,
        decode_tok_s=rate,
        prefill_tok_s=usage.prompt_tokens / ttft if usage.prompt_tokens > 0 else None,
    )


@dataclass(frozen=True)
class TimingVerdict:
    """Whose timing measures the run: `source` "client" (the stream's own times; `engine` is still kept when
    /metrics tells), "server" (the engine's, because `client_note` says why the client's cannot be), or None:
    neither can vouch for it and `rejected` says why."""

    source: TimingSource | None
    engine: EngineTiming | None
    client_note: str | None = None
    rejected: str | None = None


def settle_timing(outcome: StreamOutcome, metrics: MetricsDelta | None) -> TimingVerdict:
    """The client's timing when it is physically possible, else the engine's own when /metrics shows exactly
    this request, else a rejection naming both reasons (it starts with IMPLAUSIBLE)."""
    engine = engine_timing(outcome, metrics)
    known = engine if isinstance(engine, EngineTiming) else None
    reason = implausible_timing(outcome, metrics)
    if reason is None:
        return TimingVerdict(source="client", engine=known)
    if known is not None:
        return TimingVerdict(source="server", engine=known, client_note=reason)
    return TimingVerdict(
        source=None,
        engine=None,
        client_note=reason,
        rejected=f"{reason}; nor can the engine's /metrics vouch for it: {engine}",
    )
