"""Rich tables for the bench reports (human output; `--json` prints the models instead)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from glm53.bench.agent import AgentSection
from glm53.bench.coherence import CoherenceSection
from glm53.bench.compare import Comparison
from glm53.bench.gates import GateResult
from glm53.bench.needle import NeedleSection
from glm53.bench.runner import RunSection


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _verdict(passed: bool) -> str:
    return "[green]pass[/green]" if passed else "[red]FAIL[/red]"


def _clip(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def run_tables(console: Console, run: RunSection) -> None:
    runs = Table(
        "shape",
        "run",
        "TTFT ms",
        "prefill tok/s",
        "decode tok/s",
        "tokens in+out",
        "preempt",
        "valid",
        title=f"every run ({run.style} prompts)",
    )
    for shape in run.shapes:
        for r in shape.runs:
            preempt = r.metrics.preemptions if r.metrics is not None else None
            tokens = f"{_int(r.prompt_tokens)}+{_int(r.completion_tokens)}"
            verdict = "yes" if r.valid else f"[red]no[/red]: {_clip(r.invalid_reason or '')}"
            runs.add_row(
                shape.shape,
                str(r.run),
                _num(r.ttft_ms),
                _num(r.prefill_tok_s),
                _num(r.decode_tok_s, 2),
                tokens,
                _num(preempt, 0),
                verdict,
            )
    console.print(runs)
    best = Table(
        "shape",
        "valid runs",
        "TTFT ms",
        "prefill tok/s",
        "decode tok/s",
        title=f"best of {run.runs_per_shape} per shape",
    )
    for shape in run.shapes:
        b = shape.best
        best.add_row(
            shape.shape,
            f"{b.valid_runs}/{len(shape.runs)}",
            _num(b.ttft_ms),
            _num(b.prefill_tok_s),
            _num(b.decode_tok_s, 2),
        )
    console.print(best)


def needle_table(console: Console, needle: NeedleSection) -> None:
    table = Table(
        "size",
        "depth",
        "prompt tokens",
        "result",
        "answer / reason",
        title=f"needle recall: {sum(r.passed for r in needle.results)}/{len(needle.results)} passed",
    )
    for r in needle.results:
        shown = r.answer if r.passed else f"{r.reason}: {r.answer!r}"
        table.add_row(
            str(r.size_tokens),
            f"{r.depth:.2f}",
            str(r.prompt_tokens or "-"),
            _verdict(r.passed),
            _clip(shown),
        )
    console.print(table)


def coherence_table(console: Console, coherence: CoherenceSection) -> None:
    table = Table(
        "gate",
        "result",
        "answer",
        "reason",
        title=f"coherence: {coherence.passed}/{len(coherence.results)} passed",
    )
    for r in coherence.results:
        answer = r.answer or (
            f"(tool calls: {', '.join(c.name for c in r.tool_calls)})" if r.tool_calls else ""
        )
        if not answer and r.reasoning:
            answer = f"(reasoning only) {r.reasoning}"
        table.add_row(r.name, _verdict(r.passed), _clip(answer, 50), r.reason or "")
    console.print(table)


def agent_tables(console: Console, agent: AgentSection) -> None:
    turns = Table(
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
        title="agent turns",
    )
    for t in agent.turns:
        turns.add_row(
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
    console.print(turns)
    summary = Table("metric", "value", title="agent session")
    summary.add_row("prefix-cache hit (% of prompt tokens)", _num(agent.prefix_cache_hit_pct))
    summary.add_row("median tool-call turn latency (s)", _num(agent.median_tool_call_turn_latency_s, 3))
    summary.add_row("median turn latency (s)", _num(agent.median_turn_latency_s, 3))
    summary.add_row("mean decode tok/s in turns", _num(agent.mean_decode_tok_s))
    summary.add_row("turns with a model tool call", f"{agent.model_tool_calls}/{len(agent.turns)}")
    console.print(summary)


def gates_table(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        return
    table = Table("gate", "subject", "result", "detail", title="gates")
    for g in gates:
        table.add_row(g.name, g.subject, _verdict(g.passed), g.detail)
    console.print(table)


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
    table = Table(
        "subject",
        "metric",
        "A",
        "B",
        "B - A",
        "B vs A",
        title=f"A = {comparison.a_label}\nB = {comparison.b_label}",
    )
    for row in comparison.rows:
        pct = "-" if row.delta_pct is None else f"{row.delta_pct:+.1f}%"
        if row.b_better is not None:
            pct = f"[green]{pct}[/green]" if row.b_better else f"[red]{pct}[/red]"
        delta = "-" if row.delta is None else f"{row.delta:+,.1f}"
        subject = row.subject if row.section == "run" else row.section
        table.add_row(
            subject, _METRIC_LABELS.get(row.metric, row.metric), _num(row.a), _num(row.b), delta, pct
        )
    console.print(table)
