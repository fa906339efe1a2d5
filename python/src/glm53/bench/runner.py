"""`bench run`: the recipe's throughput measurement, one request at a time, best of N per shape.

TTFT = request start -> first streamed event carrying tokens; prefill tok/s = prompt tokens / TTFT;
decode tok/s = (completion tokens - 1) / (end - first token time). A run counts only when the usage matches
the request, every finish reason is `length` and its timing is physically possible (glm53.bench.timing). When
the stream's arrival is not (a busy engine coalesced its events, a proxy buffered them), the engine's own
timings of the request from `/metrics` are the measurement (`timing_source` "server"); a run neither can vouch
for is invalid, kept with its reason, and measured again (`--retries`). Each shape reports the best and the
median of its valid runs.
"""

from __future__ import annotations

import math
import secrets
import statistics
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from glm53.bench.backends import FleetSplit
from glm53.bench.gates import GateResult, maximum_gates, minimum_gates
from glm53.bench.metrics import MetricsDelta, delta_after, snapshot
from glm53.bench.prompts import PromptFactory, PromptStyle
from glm53.bench.stream import StreamOutcome, decode_rate, prefill_rate
from glm53.bench.timing import IMPLAUSIBLE, TimingSource, TimingVerdict, server_decode_rate, settle_timing
from glm53.errors import BadInput, CheckFailed

DEFAULT_SHAPES = "8192:2048,131072:2048,260096:2048"
# No served model has a context of ten million tokens; a larger count is a typo that would only fill memory
# building the prompt (when the server does not say its max_model_len).
MAX_TOKENS_PER_REQUEST = 10_000_000
# The header vLLM's router keys `consistent_hash` on: a bench request names its conversation, so that a router
# keeps a conversation on one box (and, in `bench run`, spreads independent runs over the boxes).
SESSION_HEADER = "X-Session-ID"
# Extra attempts per shape for runs rejected as implausible timing (neither the client's clock nor the engine's
# /metrics could vouch for them: other traffic on the engine, no /metrics); a stream that can never be timed is
# still rejected every time.
DEFAULT_RETRIES = 2
# Runs per shape: the best is reported (glm53.bench.settings.RunSettings).
DEFAULT_RUNS = 2


class Shape(BaseModel):
    prompt_tokens: int = Field(gt=0, le=MAX_TOKENS_PER_REQUEST)
    output_tokens: int = Field(
        gt=1, le=MAX_TOKENS_PER_REQUEST, description="two at least: decode speed needs a second token"
    )

    @property
    def label(self) -> str:
        return f"{self.prompt_tokens}:{self.output_tokens}"


def parse_shapes(spec: str, *, flag: str = "--shapes") -> list[Shape]:
    """`8192:2048,131072:2048` -> shapes; errors name the flag and the bad item."""
    shapes: list[Shape] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        prompt, sep, output = item.partition(":")
        try:
            if not sep:
                raise ValueError
            shape = Shape(prompt_tokens=int(prompt.replace("_", "")), output_tokens=int(output.replace("_", "")))
        except ValueError as exc:
            raise BadInput(
                f"{flag}: {item!r} is not PROMPT:OUTPUT with PROMPT >= 1 and OUTPUT >= 2 "
                f"(at most {MAX_TOKENS_PER_REQUEST:,} each)",
                fix=f"e.g. {flag} 8192:2048,131072:2048",
            ) from exc
        shapes.append(shape)
    if not shapes:
        raise BadInput(f"{flag} is empty", fix=f"e.g. {flag} {DEFAULT_SHAPES}")
    return shapes


class RunRecord(BaseModel):
    """One request, valid or not; every run is kept in the report."""

    shape: str
    run: int = Field(description="attempt number within the shape, repeats of rejected runs included")
    started_at: str
    cache_salt: str
    prompt_tokens_requested: int
    output_tokens_requested: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    total_s: float | None = None
    token_events: int = 0
    finish_reasons: list[str | None] = Field(default_factory=list)
    http_status: int | None = None
    valid: bool = False
    invalid_reason: str | None = None
    metrics: MetricsDelta | None = None
    server_decode_tok_s: float | None = Field(
        None, description="the engine's own decode rate for this request, from /metrics, when it tells"
    )
    timing_source: TimingSource | None = Field(
        None,
        description="whose clock ttft_ms, prefill_tok_s and decode_tok_s come from: 'client' (the stream as it "
        "arrived) or 'server' (the engine's own /metrics, because client_timing_note says why the stream's "
        "arrival cannot be timed); None when the run is invalid",
    )
    client_timing_note: str | None = Field(
        None, description="why the client's own timing of the stream was not used (timing_source 'server')"
    )
    session_id: str | None = Field(None, description=f"the {SESSION_HEADER} header sent (a router's key)")
    backend: str | None = Field(None, description="the backend that served it (--backend), from its /metrics")


class BestOf(BaseModel):
    """Best of the valid runs, each figure on its own (as the recipe reports them), and their medians."""

    valid_runs: int
    ttft_ms: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    median_ttft_ms: float | None = None
    median_prefill_tok_s: float | None = None
    median_decode_tok_s: float | None = None
    rejected_runs: int = Field(
        0, description="runs whose timing neither the client nor the engine's /metrics could vouch for (each says why)"
    )
    server_timed_runs: int = Field(
        0, description="valid runs measured by the engine's own /metrics (timing_source 'server')"
    )


class ShapeResult(BaseModel):
    shape: str
    prompt_tokens: int
    output_tokens: int
    runs: list[RunRecord]
    best: BestOf


class RunSection(BaseModel):
    style: PromptStyle
    runs_per_shape: int
    shapes: list[ShapeResult]
    complete: bool = Field(True, description="False in a report written while runs were still to come")
    backends: FleetSplit | None = Field(None, description="per-backend split through a router (--backend)")


class Streamer(Protocol):
    def stream(self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> StreamOutcome: ...
    def metrics_text(self) -> str | None: ...


def completion_body(model: str, prompt: list[int], output_tokens: int, cache_salt: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_salt": cache_salt,
        "stream_options": {"include_usage": True},
    }


def _answer_problem(outcome: StreamOutcome, shape: Shape) -> str | None:
    """Why the answer itself does not count (the recipe's validity rule and what timing needs), or None."""
    if outcome.error:
        return outcome.error
    if outcome.usage is None:
        return "no usage in the stream (stream_options.include_usage not honoured)"
    if outcome.usage.prompt_tokens != shape.prompt_tokens:
        return f"usage reports {outcome.usage.prompt_tokens} prompt tokens, {shape.prompt_tokens} were sent"
    if outcome.usage.completion_tokens != shape.output_tokens:
        return (
            f"usage reports {outcome.usage.completion_tokens} completion tokens, {shape.output_tokens} were requested"
        )
    if not outcome.finish_reasons or any(reason != "length" for reason in outcome.finish_reasons):
        return f"finish reasons {outcome.finish_reasons}, expected 'length' for every choice"
    if outcome.ttft_s is None or outcome.end_s is None or outcome.end_s <= outcome.ttft_s:
        return "no token event before the end of the stream"
    return None


def assess_run(
    outcome: StreamOutcome, shape: Shape, metrics: MetricsDelta | None = None
) -> tuple[str | None, TimingVerdict | None]:
    """(why the run is invalid or None, whose timing measures it): the answer must be the one asked for, and
    its timing must be vouched for by the client's clock or, failing that, by the engine's own /metrics."""
    problem = _answer_problem(outcome, shape)
    if problem is not None:
        return problem, None
    verdict = settle_timing(outcome, metrics)
    return verdict.rejected, verdict


def judge_run(outcome: StreamOutcome, shape: Shape, metrics: MetricsDelta | None = None) -> tuple[bool, str | None]:
    """(valid, reason when not): `assess_run` without the timing source."""
    reason, _ = assess_run(outcome, shape, metrics)
    return reason is None, reason


def measure(outcome: StreamOutcome, verdict: TimingVerdict | None = None) -> dict[str, float | None]:
    """TTFT, prefill and decode rates (None where undefined): the stream's own times and usage, or the engine's
    when the verdict says the client's clock cannot time this stream."""
    if verdict is not None and verdict.source == "server" and verdict.engine is not None:
        engine = verdict.engine
        return {
            "ttft_ms": engine.ttft_s * 1000.0,
            "prefill_tok_s": engine.prefill_tok_s,
            "decode_tok_s": engine.decode_tok_s,
            "total_s": outcome.end_s,
        }
    ttft = outcome.ttft_s
    return {
        "ttft_ms": ttft * 1000.0 if ttft is not None else None,
        "prefill_tok_s": prefill_rate(outcome),
        "decode_tok_s": decode_rate(outcome),
        "total_s": outcome.end_s,
    }


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def best_of(runs: Sequence[RunRecord]) -> BestOf:
    valid = [r for r in runs if r.valid]
    ttfts = _finite([r.ttft_ms for r in valid])
    prefills = _finite([r.prefill_tok_s for r in valid])
    decodes = _finite([r.decode_tok_s for r in valid])
    return BestOf(
        valid_runs=len(valid),
        ttft_ms=min(ttfts) if ttfts else None,
        prefill_tok_s=max(prefills) if prefills else None,
        decode_tok_s=max(decodes) if decodes else None,
        median_ttft_ms=statistics.median(ttfts) if ttfts else None,
        median_prefill_tok_s=statistics.median(prefills) if prefills else None,
        median_decode_tok_s=statistics.median(decodes) if decodes else None,
        rejected_runs=sum(1 for r in runs if _rejected_timing(r)),
        server_timed_runs=sum(1 for r in valid if r.timing_source == "server"),
    )


def fitting_shapes(max_model_len: int | None) -> tuple[list[Shape], str | None]:
    """The default shapes for a server: the recipe's that fit its context (all of them when it does not say),
    else one shape of half its context and up to 2,048 output tokens; with a note saying what was left out."""
    recipe = parse_shapes(DEFAULT_SHAPES)
    if max_model_len is None:
        return recipe, None
    fit = [shape for shape in recipe if shape.prompt_tokens + shape.output_tokens <= max_model_len]
    left = [shape.label for shape in recipe if shape not in fit]
    if not left:
        return recipe, None
    if not fit:
        output = max(2, min(2048, max_model_len // 8))
        prompt = max(1, min(max_model_len // 2, max_model_len - output))
        if prompt + output > max_model_len:
            raise BadInput(
                f"the server's max_model_len {max_model_len} is too small for a benchmark shape",
                fix="serve with a larger MAX_MODEL_LEN",
            )
        fit = [Shape(prompt_tokens=prompt, output_tokens=output)]
    labels = ",".join(shape.label for shape in fit)
    note = (
        f"the recipe's shapes {', '.join(left)} do not fit the server's max_model_len {max_model_len}: "
        f"measuring {labels} (pass --shapes to choose)"
    )
    return fit, note


def check_fits(shapes: Sequence[Shape], max_model_len: int | None, *, flag: str = "--shapes") -> None:
    if max_model_len is None:
        return
    for shape in shapes:
        needed = shape.prompt_tokens + shape.output_tokens
        if needed > max_model_len:
            raise BadInput(
                f"{flag}: {shape.label} needs {needed} tokens of context; the server's max_model_len is "
                f"{max_model_len}",
                fix=f"pass smaller {flag}, or serve with a larger MAX_MODEL_LEN",
            )


def run_one(client: Streamer, model: str, prompt: list[int], shape: Shape, run: int) -> RunRecord:
    salt = secrets.token_hex(16)
    session_id = f"glm53-bench-run-{salt[:16]}"
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    before = snapshot(client)
    outcome = client.stream(
        "/v1/completions",
        completion_body(model, prompt, shape.output_tokens, salt),
        headers={SESSION_HEADER: session_id},
    )
    _, metrics = delta_after(client, before, finished=outcome.error is None and outcome.done)
    reason, verdict = assess_run(outcome, shape, metrics)
    usage = outcome.usage
    return RunRecord(
        shape=shape.label,
        run=run,
        started_at=started_at,
        cache_salt=salt,
        prompt_tokens_requested=shape.prompt_tokens,
        output_tokens_requested=shape.output_tokens,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
        token_events=outcome.token_events,
        finish_reasons=outcome.finish_reasons,
        http_status=outcome.http_status,
        valid=reason is None,
        invalid_reason=reason,
        metrics=metrics,
        server_decode_tok_s=server_decode_rate(outcome, metrics),
        timing_source=verdict.source if reason is None and verdict is not None else None,
        client_timing_note=verdict.client_note if verdict is not None and verdict.source == "server" else None,
        session_id=session_id,
        **measure(outcome, verdict),
    )


def run_benchmark(
    client: Streamer,
    prompts: PromptFactory,
    model: str,
    shapes: Sequence[Shape],
    *,
    runs: int,
    style: PromptStyle = "prose",
    retries: int = DEFAULT_RETRIES,
    on_run: Callable[[RunRecord], None] | None = None,
    on_retry: Callable[[], None] | None = None,
    on_section: Callable[[RunSection], None] | None = None,
) -> RunSection:
    """Every shape `runs` times, in order; one failing request never stops the others. A run rejected for
    implausible timing (neither the client's clock nor the engine's /metrics can time it) is measured again, at most
    `retries` extra times per shape; the rejected run stays in the report. Any other invalid run (an error, a
    wrong usage) is the server's answer and is not repeated. `on_section` gets the section so far (`complete`
    False) after every run, for a report that a crash or Ctrl-C cannot take."""
    if runs < 1:
        raise BadInput(f"--runs must be at least 1, got {runs}")
    if retries < 0:
        raise BadInput(f"--retries must be 0 or more, got {retries}")
    results: list[ShapeResult] = []
    for index, shape in enumerate(shapes):
        prompt = prompts.exact(shape.prompt_tokens, style, seed=index)
        records: list[RunRecord] = []
        wanted, retries_left, attempt = runs, retries, 0
        while wanted > 0:
            attempt += 1
            record = run_one(client, model, prompt, shape, attempt)
            records.append(record)
            if on_run is not None:
                on_run(record)
            if _rejected_timing(record) and retries_left > 0:
                retries_left -= 1
                if on_retry is not None:
                    on_retry()
            else:
                wanted -= 1
            if on_section is not None:
                partial = [*results, _shape_result(shape, records)]
                on_section(RunSection(style=style, runs_per_shape=runs, shapes=partial, complete=False))
        results.append(_shape_result(shape, records))
    return RunSection(style=style, runs_per_shape=runs, shapes=results)


def _rejected_timing(record: RunRecord) -> bool:
    return (record.invalid_reason or "").startswith(IMPLAUSIBLE)


def _shape_result(shape: Shape, records: list[RunRecord]) -> ShapeResult:
    return ShapeResult(
        shape=shape.label,
        prompt_tokens=shape.prompt_tokens,
        output_tokens=shape.output_tokens,
        runs=list(records),
        best=best_of(records),
    )


RUN_FAIL_UNDER = {
    "decode": "best decode tok/s of every shape",
    "prefill": "best prefill tok/s of every shape",
}
RUN_FAIL_OVER = {"ttft": "best TTFT of every shape, in seconds"}


def run_gates(run: RunSection, under: dict[str, float], over: dict[str, float]) -> list[GateResult]:
    """Each threshold checked against each shape's best; a shape without a valid run fails it."""
    gates: list[GateResult] = []
    if "decode" in under:
        gates += minimum_gates("decode", under["decode"], [(s.shape, s.best.decode_tok_s) for s in run.shapes], "tok/s")
    if "prefill" in under:
        gates += minimum_gates(
            "prefill", under["prefill"], [(s.shape, s.best.prefill_tok_s) for s in run.shapes], "tok/s"
        )
    if "ttft" in over:
        values = [(s.shape, s.best.ttft_ms / 1000.0 if s.best.ttft_ms is not None else None) for s in run.shapes]
        gates += maximum_gates("ttft", over["ttft"], values, "s")
    return gates


def require_valid_runs(run: RunSection, report: Path) -> None:
    """Exit 1 (CheckFailed) when a shape has no valid run: nothing of it was measured, whatever the gates."""
    empty = [shape.shape for shape in run.shapes if shape.best.valid_runs == 0]
    if empty:
        raise CheckFailed(f"no valid run for {', '.join(empty)}", fix=f"each run's reason is in {report}")
