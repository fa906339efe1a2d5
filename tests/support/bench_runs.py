"""Run sections built by hand for the bench tests: a record, the shape result that holds records, the section."""

from __future__ import annotations

from typing import Any

from glm53.bench.runner import RunRecord, RunSection, ShapeResult, best_of


def run_record(
    shape: str = "64:4",
    *,
    run: int = 1,
    ttft_ms: float | None = 10.0,
    decode_tok_s: float | None = 50.0,
    valid: bool = True,
    started_at: str = "t",
    cache_salt: str = "s",
    **fields: Any,
) -> RunRecord:
    """One timed request of `shape` (PROMPT:OUTPUT, the tokens asked for); `fields`: the record's other fields."""
    prompt, output = (int(part) for part in shape.split(":"))
    return RunRecord(
        shape=shape,
        run=run,
        started_at=started_at,
        cache_salt=cache_salt,
        prompt_tokens_requested=prompt,
        output_tokens_requested=output,
        ttft_ms=ttft_ms,
        decode_tok_s=decode_tok_s,
        valid=valid,
        **fields,
    )


def shape_result(*records: RunRecord) -> ShapeResult:
    """The shape of `records` (one shape, at least one record) with its runs and their best."""
    first = records[0]
    return ShapeResult(
        shape=first.shape,
        prompt_tokens=first.prompt_tokens_requested,
        output_tokens=first.output_tokens_requested,
        runs=list(records),
        best=best_of(records),
    )


def run_section(*shapes: ShapeResult, runs_per_shape: int = 1) -> RunSection:
    """A finished prose run section of `shapes`."""
    return RunSection(style="prose", runs_per_shape=runs_per_shape, shapes=list(shapes))


def one_run_section(**record: Any) -> RunSection:
    """A section of one shape measured once: `run_record(**record)`."""
    return run_section(shape_result(run_record(**record)))
