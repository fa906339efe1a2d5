"""`bench compare`: two reports side by side, or one report against the recipe's published points.

A is the baseline, B the candidate: each row shows A, B, B - A and (B - A) / A. Against the recipe, the recipe
is A and the report is B, so the deltas read as "this host versus the recipe". With thresholds, compare is a
gate on the candidate (B, or the one report): the same keys and rule as `bench run --fail-under/--fail-over`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from glm53.bench.agent import AgentSection
from glm53.bench.gates import GateResult, maximum_gates, minimum_gates
from glm53.bench.report import Summary, load_summary
from glm53.bench.runner import RUN_FAIL_OVER, RUN_FAIL_UNDER, run_gates
from glm53.errors import BadInput
from glm53.recipe.performance import RecipeAgent, recipe_performance

Metric = Literal["ttft_ms", "prefill_tok_s", "decode_tok_s"]
METRICS: tuple[Metric, ...] = ("ttft_ms", "prefill_tok_s", "decode_tok_s")
AGENT_METRICS: tuple[str, ...] = (
    "prefix_cache_hit_pct",
    "median_tool_call_turn_latency_s",
    "mean_decode_tok_s",
)
_LOWER_IS_BETTER = frozenset({"ttft_ms", "median_tool_call_turn_latency_s"})


class ComparisonRow(BaseModel):
    section: str
    subject: str
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    delta_pct: float | None
    b_better: bool | None
    a_median: float | None = Field(None, description="the median of A's valid runs, beside its best (a)")
    b_median: float | None = Field(None, description="the median of B's valid runs, beside its best (b)")
    note: str | None = Field(None, description="why a value is null although both sides have one")


class Comparison(BaseModel):
    a_label: str
    b_label: str
    rows: list[ComparisonRow]

    @property
    def compared(self) -> int:
        """Rows with a value on both sides: what the comparison actually compares."""
        return sum(1 for row in self.rows if row.a is not None and row.b is not None)

    def why_empty(self) -> str | None:
        """When nothing is on both sides, which shapes each side has (the B - A cells are then all empty)."""
        if self.compared:
            return None

        def shapes(side: str) -> str:
            have = sorted(
                {row.subject for row in self.rows if row.section == "run" and getattr(row, side) is not None},
                key=lambda text: tuple(int(part) for part in text.split(":")),
            )
            return ", ".join(have) or "none"

        return (
            f"nothing to compare: no shape (context:output tokens) is measured on both sides: "
            f"A has {shapes('a')}, B has {shapes('b')}"
        )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _row(
    section: str,
    subject: str,
    metric: str,
    a: float | None,
    b: float | None,
    *,
    a_median: float | None = None,
    b_median: float | None = None,
) -> ComparisonRow:
    """A, B, B - A and (B - A) / A; a difference that does not fit a float (1e308 - -1e308) is null, with a
    note saying so, never an infinity (which JSON cannot hold)."""
    a, b = _finite(a), _finite(b)
    delta = b - a if a is not None and b is not None else None
    pct = delta / a * 100.0 if delta is not None and a else None
    notes = []
    if delta is not None and not math.isfinite(delta):
        notes.append("B - A overflows a float")
        delta = None
    if pct is not None and not math.isfinite(pct):
        notes.append("(B - A) / A overflows a float")
        pct = None
    better = None if delta is None or delta == 0 else (delta < 0) == (metric in _LOWER_IS_BETTER)
    if delta is None and a is not None and b is not None and a != b:
        better = (b < a) == (metric in _LOWER_IS_BETTER)
    return ComparisonRow(
        section=section,
        subject=subject,
        metric=metric,
        a=a,
        b=b,
        delta=delta,
        delta_pct=pct,
        b_better=better,
        a_median=_finite(a_median),
        b_median=_finite(b_median),
        note="; ".join(notes) or None,
    )


_MEDIANS = {"ttft_ms": "median_ttft_ms", "prefill_tok_s": "median_prefill_tok_s", "decode_tok_s": "median_decode_tok_s"}


def _best_points(summary: Summary) -> dict[tuple[int, int], dict[str, float | None]]:
    """Per shape: each metric's best, and its median under 'median_<metric>'."""
    if summary.run is None:
        return {}
    return {
        (shape.prompt_tokens, shape.output_tokens): {
            **{metric: getattr(shape.best, metric) for metric in METRICS},
            **{_MEDIANS[metric]: getattr(shape.best, _MEDIANS[metric]) for metric in METRICS},
        }
        for shape in summary.run.shapes
    }


def compare_summaries(a: Summary, b: Summary, *, a_label: str = "A", b_label: str = "B") -> Comparison:
    rows: list[ComparisonRow] = []
    points_a, points_b = _best_points(a), _best_points(b)
    for key in sorted(set(points_a) | set(points_b)):
        subject = f"{key[0]}:{key[1]}"
        for metric in METRICS:
            a_point, b_point = points_a.get(key, {}), points_b.get(key, {})
            rows.append(
                _row(
                    "run",
                    subject,
                    metric,
                    a_point.get(metric),
                    b_point.get(metric),
                    a_median=a_point.get(_MEDIANS[metric]),
                    b_median=b_point.get(_MEDIANS[metric]),
                )
            )
    if a.needle is not None or b.needle is not None:
        rows.append(
            _row(
                "needle",
                "all",
                "pass_rate_pct",
                a.needle.pass_rate * 100 if a.needle else None,
                b.needle.pass_rate * 100 if b.needle else None,
            )
        )
    if a.coherence is not None or b.coherence is not None:
        rows.append(
            _row(
                "coherence",
                "all",
                "passed",
                float(a.coherence.passed) if a.coherence else None,
                float(b.coherence.passed) if b.coherence else None,
            )
        )
    if a.agent is not None or b.agent is not None:
        rows.extend(_agent_rows(a.agent, b.agent))
    if not rows:
        raise BadInput("neither report has a section to compare", fix="run `glm53 bench run` first")
    return Comparison(a_label=a_label, b_label=b_label, rows=rows)


def _agent_rows(a: RecipeAgent | AgentSection | None, b: AgentSection | None) -> list[ComparisonRow]:
    """One row per agent metric; a side without an agent section (None) has no values."""
    return [
        _row(
            "agent",
            "session",
            metric,
            getattr(a, metric) if a is not None else None,
            getattr(b, metric) if b is not None else None,
        )
        for metric in AGENT_METRICS
    ]


def compare_to_recipe(summary: Summary, *, profile: str | None = None, label: str = "this host") -> Comparison:
    recipe = recipe_performance()
    profile = profile or recipe.default_profile
    if profile not in recipe.profiles:
        raise BadInput(
            f"--figures {profile!r} is not one of the recipe's",
            fix=f"use one of: {', '.join(recipe.profiles)}",
        )
    mine = _best_points(summary)
    rows: list[ComparisonRow] = []
    for point in recipe.profiles[profile]:
        key = (point.context_len, point.output_tokens)
        for metric in METRICS:
            ours = mine.get(key, {})
            rows.append(
                _row(
                    "run",
                    f"{key[0]}:{key[1]}",
                    metric,
                    getattr(point, metric),
                    ours.get(metric),
                    b_median=ours.get(_MEDIANS[metric]),
                )
            )
    for key in sorted(set(mine) - {(p.context_len, p.output_tokens) for p in recipe.profiles[profile]}):
        for metric in METRICS:
            rows.append(
                _row("run", f"{key[0]}:{key[1]}", metric, None, mine[key][metric], b_median=mine[key][_MEDIANS[metric]])
            )
    if summary.agent is not None:
        rows.extend(_agent_rows(recipe.agent, summary.agent))
    return Comparison(a_label=f"recipe ({profile})", b_label=label, rows=rows)


class ComparedReports(BaseModel):
    comparison: Comparison
    candidate: Summary
    candidate_path: Path = Field(description="the report the gates judge: B, or A alone")


def compare_reports(a: Path, b: Path | None, *, profile: str | None = None) -> ComparedReports:
    """A vs B, or (without B) the recipe's `profile` vs A."""
    first = load_summary(a)
    if b is None:
        return ComparedReports(
            comparison=compare_to_recipe(first, profile=profile, label=str(a)), candidate=first, candidate_path=a
        )
    candidate = load_summary(b)
    comparison = compare_summaries(first, candidate, a_label=str(a), b_label=str(b))
    return ComparedReports(comparison=comparison, candidate=candidate, candidate_path=b)


COMPARE_FAIL_UNDER = RUN_FAIL_UNDER
COMPARE_FAIL_OVER = RUN_FAIL_OVER


def compare_gates(candidate: Summary, under: dict[str, float], over: dict[str, float]) -> list[GateResult]:
    """`bench run`'s gates on the candidate's run section; a report without one fails every threshold."""
    if candidate.run is not None:
        return run_gates(candidate.run, under, over)
    missing: list[tuple[str, float | None]] = [("no run section", None)]
    gates: list[GateResult] = []
    for key, threshold in under.items():
        gates += minimum_gates(key, threshold, missing, "tok/s")
    for key, threshold in over.items():
        gates += maximum_gates(key, threshold, missing, "s")
    return gates
