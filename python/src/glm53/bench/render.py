"""Rich tables for the bench reports (human output; `--json` prints the models instead), and the line each
finished request prints while a measurement runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rich.console import Console
from rich.table import Table

from glm53.bench.agent import AgentSection, TurnRecord
from glm53.bench.backends import FleetSplit
from glm53.bench.coherence import CoherenceResult, CoherenceSection
from glm53.bench.compare import Comparison, ComparisonRow
from glm53.bench.gates import GateResult
from glm53.bench.needle import NeedleResult, NeedleSection
from glm53.bench.runner import RunRecord, RunSection


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _verdict(passed: bool) -> str:
    return "[green]pass[/green]" if passed else "[red]FAIL[/red]"


def _clip(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _print_table(console: Console, columns: Sequence[str], rows: Iterable[Sequence[str]], *, title: str) -> None:
    """A table of `columns` with one line per row, printed."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def run_tables(console: Console, run: RunSection) -> None:
    _print_table(
        console,
        ("shape", "run", "TTFT ms", "prefill tok/s", "decode tok/s", "tokens in+out", "preempt", "valid"),
        (
            (
                shape.shape,
                str(r.run),
                _num(r.ttft_ms),
                _num(r.prefill_tok_s),
                _num(r.decode_tok_s, 2),
                f"{_int(r.prompt_tokens)}+{_int(r.completion_tokens)}",
                _num(r.metrics.preemptions if r.metrics is not None else None, 0),
                _validity(r),
            )
            for shape in run.shapes
            for r in shape.runs
        ),
        title=f"every run ({run.style} prompts)",
    )
    _print_table(
        console,
        ("shape", "valid runs", "TTFT ms (median)", "prefill tok/s (median)", "decode tok/s (median)", "rejected"),
        (
            (
                shape.shape,
                f"{shape.best.valid_runs}/{len(shape.runs)}"
                + (f" ({shape.best.server_timed_runs} engine-timed)" if shape.best.server_timed_runs else ""),
                _with_median(shape.best.ttft_ms, shape.best.median_ttft_ms),
                _with_median(shape.best.prefill_tok_s, shape.best.median_prefill_tok_s),
                _with_median(shape.best.decode_tok_s, shape.best.median_decode_tok_s, 2),
                str(shape.best.rejected_runs) if shape.best.rejected_runs else "-",
            )
            for shape in run.shapes
        ),
        title=f"best of {run.runs_per_shape} per shape (median of the valid runs); rejected: implausible timing"
        + ("" if run.complete else " [incomplete]"),
    )
    if run.backends is not None:
        backends_table(console, run.backends)


def _validity(record: RunRecord) -> str:
    if not record.valid:
        return f"[red]no[/red]: {_clip(record.invalid_reason or '')}"
    return "yes, engine-timed" if record.timing_source == "server" else "yes"


def backends_table(console: Console, split: FleetSplit) -> None:
    """The per-backend split of a bench through a router, from each backend's own /metrics."""
    sessions = split.sessions > 0
    columns = ["backend", "requests", "share %", "served", "prompt tokens", "generated", "cache hits/queries", "hit %"]
    rows = []
    for b in split.backends:
        row = [
            b.url,
            _num(b.requests, 0),
            _num(b.requests_pct),
            str(b.served),
            _num(b.prompt_tokens, 0),
            _num(b.generation_tokens, 0),
            f"{_num(b.prefix_cache_hits, 0)}/{_num(b.prefix_cache_queries, 0)}",
            _num(b.prefix_cache_hit_pct),
        ]
        if sessions:
            row.append(str(b.sessions))
        if b.error:
            row[0] += f" [red]({_clip(b.error, 40)})[/red]"
        rows.append(row)
    rows.append(
        [
            "all backends",
            _num(split.requests, 0),
            "100.0" if split.requests else "-",
            str(sum(b.served for b in split.backends)) + (f" (+{split.unattributed} ?)" if split.unattributed else ""),
            _num(_sum(b.prompt_tokens for b in split.backends), 0),
            _num(_sum(b.generation_tokens for b in split.backends), 0),
            "",
            _num(split.prefix_cache_hit_pct),
        ]
        + ([f"{split.sessions_on_one_backend}/{split.sessions} on one box"] if sessions else [])
    )
    if sessions:
        columns.append("sessions")
    _print_table(
        console,
        columns,
        rows,
        title="per-backend split (each backend's own /metrics: requests finished, tokens, prefix cache; "
        "served = this bench's requests attributed one by one)",
    )


def _sum(values: Iterable[float | None]) -> float | None:
    items = list(values)
    return None if not items or any(v is None for v in items) else sum(v for v in items if v is not None)


def _with_median(best: float | None, median: float | None, digits: int = 1) -> str:
    return _num(best, digits) if median is None else f"{_num(best, digits)} ({_num(median, digits)})"


def needle_table(console: Console, needle: NeedleSection) -> None:
    _print_table(
        console,
        ("size", "depth", "prompt tokens", "result", "answer / reason"),
        (
            (
                str(r.size_tokens),
                f"{r.depth:.2f}",
                str(r.prompt_tokens or "-"),
                _verdict(r.passed),
                _clip(r.answer if r.passed else f"{r.reason}: {r.answer!r}"),
            )
            for r in needle.results
        ),
        title=f"needle recall: {sum(r.passed for r in needle.results)}/{len(needle.results)} passed",
    )


def coherence_table(console: Console, coherence: CoherenceSection) -> None:
    _print_table(
        console,
        ("gate", "result", "answer", "reason"),
        ((r.name, _verdict(r.passed), _clip(_coherence_answer(r), 50), r.reason or "") for r in coherence.results),
        title=f"coherence: {coherence.passed}/{len(coherence.results)} passed",
    )


def _coherence_answer(r: CoherenceResult) -> str:
    answer = r.answer or (f"(tool calls: {', '.join(c.name for c in r.tool_calls)})" if r.tool_calls else "")
    if not answer and r.reasoning:
        answer = f"(reasoning only) {r.reasoning}"
    return answer


def agent_tables(console: Console, agent: AgentSection) -> None:
    _print_table(
        console,
        (
            "task",
            "turn",
            "expected tool",
            "model called",
            "prompt",
            "cached",
            "TTFT s",
            "latency s",
            "decode tok/s",
            "error",
        ),
        (
            (
                t.task,
                str(t.turn),
                t.expected_tool,
                t.model_tool_call or "-",
                str(t.prompt_tokens or "-"),
                str(t.cached_tokens if t.cached_tokens is not None else "-"),
                _num(t.ttft_s, 3),
                _num(t.latency_s, 3),
                _num(t.decode_tok_s, 1),
                _clip(t.error or "", 40),
            )
            for t in agent.turns
        ),
        title="agent turns",
    )
    _print_table(
        console,
        ("metric", "value"),
        (
            ("prefix-cache hit (% of prompt tokens)", _num(agent.prefix_cache_hit_pct)),
            ("median tool-call turn latency (s)", _num(agent.median_tool_call_turn_latency_s, 3)),
            ("median turn latency (s)", _num(agent.median_turn_latency_s, 3)),
            ("mean decode tok/s in turns", _num(agent.mean_decode_tok_s)),
            ("median decode tok/s in turns", _num(agent.median_decode_tok_s)),
            ("turns with a model tool call", f"{agent.model_tool_calls}/{len(agent.turns)}"),
        ),
        title="agent session",
    )
    if agent.backends is not None:
        backends_table(console, agent.backends)


def run_line(record: RunRecord) -> str:
    if not record.valid:
        verdict = f"INVALID: {record.invalid_reason}"
    elif record.timing_source == "server":
        verdict = "valid, timed by the engine's /metrics (the stream arrived coalesced)"
    else:
        verdict = "valid"
    return (
        f"  {record.shape} run {record.run}: TTFT {_num(record.ttft_ms)} ms, "
        f"decode {_num(record.decode_tok_s)} tok/s, {verdict}"
    )


def needle_line(result: NeedleResult) -> str:
    return f"  {result.size_tokens} @ {result.depth:.2f}: {'pass' if result.passed else result.reason}"


def coherence_line(result: CoherenceResult) -> str:
    return f"  {result.name}: {'pass' if result.passed else result.reason}"


def turn_line(turn: TurnRecord) -> str:
    return f"  {turn.task} turn {turn.turn}: {_num(turn.latency_s)} s" + (f", {turn.error}" if turn.error else "")


def with_gates(
    render: Callable[[Console], None], gates: Sequence[GateResult], summary: str | None
) -> Callable[[Console], None]:
    """`render`, then the gates, then where the report was written (when one was)."""

    def show(console: Console) -> None:
        render(console)
        gates_table(console, gates)
        if summary is not None:
            console.print(f"report: {summary}")

    return show


def gates_table(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        return
    _print_table(
        console,
        ("gate", "subject", "result", "detail"),
        ((g.name, g.subject, _verdict(g.passed), g.detail) for g in gates),
        title="gates",
    )


_METRIC_LABELS = {
    "ttft_ms": "TTFT ms",
    "prefill_tok_s": "prefill tok/s",
    "decode_tok_s": "decode tok/s",
    "pass_rate_pct": "needle pass %",
    "passed": "coherence passed",
    "prefix_cache_hit_pct": "cache hit %",
    "median_tool_call_turn_latency_s": "tool turn s",
    "mean_decode_tok_s": "turn decode tok/s",
}


def comparison_table(console: Console, comparison: Comparison) -> None:
    _print_table(
        console,
        ("subject", "metric", "A", "B", "B - A", "B vs A"),
        (
            (
                row.subject if row.section == "run" else row.section,
                _METRIC_LABELS.get(row.metric, row.metric),
                _with_median(row.a, row.a_median),
                _with_median(row.b, row.b_median),
                ("-" if row.delta is None else f"{row.delta:+,.1f}") + (f" ({row.note})" if row.note else ""),
                _delta_pct(row),
            )
            for row in comparison.rows
        ),
        title=f"A = {comparison.a_label}\nB = {comparison.b_label}\n(run rows: best of N, median in brackets)",
    )


def _delta_pct(row: ComparisonRow) -> str:
    pct = "-" if row.delta_pct is None else f"{row.delta_pct:+.1f}%"
    if row.b_better is not None:
        pct = f"[green]{pct}[/green]" if row.b_better else f"[red]{pct}[/red]"
    return pct
