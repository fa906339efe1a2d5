"""Thresholds that turn a report into a pass/fail gate: `--fail-under decode=45,prefill=1000`.

A gate is evaluated on the value the report publishes (the best of N per shape, so every shape must meet
it); a missing value (no valid run) fails the gate, since nothing was shown to meet it, and so does a value
that is not a finite number. Thresholds must be finite numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from glm53.errors import BadInput, CheckFailed


class GateResult(BaseModel):
    name: str
    subject: str
    threshold: float
    value: float | None
    passed: bool
    detail: str


def parse_thresholds(spec: str | None, allowed: Mapping[str, str], *, flag: str = "--fail-under") -> dict[str, float]:
    """`decode=45,prefill=1000` -> {"decode": 45.0, ...}; keys must be in `allowed` (key -> meaning)."""
    if not spec:
        return {}
    thresholds: dict[str, float] = {}
    choices = ", ".join(f"{key} ({meaning})" for key, meaning in allowed.items())
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().lower().replace("_", "-")
        if not sep or key not in allowed:
            raise BadInput(f"{flag}: {item!r} is not KEY=NUMBER with a known KEY", fix=f"keys: {choices}")
        try:
            value = float(raw)
        except ValueError as exc:
            raise BadInput(f"{flag}: {key}={raw!r} is not a number", fix=f"e.g. {flag} {key}=45") from exc
        # float() accepts "nan" and "inf": a gate against them could never pass (or never fail).
        if not math.isfinite(value):
            raise BadInput(f"{flag}: {key}={raw.strip()!r} is not a finite number", fix=f"e.g. {flag} {key}=45")
        thresholds[key] = value
    return thresholds


def parse_limits(
    fail_under: str | None,
    under_allowed: Mapping[str, str],
    fail_over: str | None,
    over_allowed: Mapping[str, str],
) -> tuple[dict[str, float], dict[str, float]]:
    """--fail-under and --fail-over, each parsed against the metrics it may name."""
    return (
        parse_thresholds(fail_under, under_allowed, flag="--fail-under"),
        parse_thresholds(fail_over, over_allowed, flag="--fail-over"),
    )


def minimum_gates(
    name: str, threshold: float, values: Iterable[tuple[str, float | None]], unit: str
) -> list[GateResult]:
    """One result per subject: passes when value >= threshold."""
    results = []
    for subject, raw in values:
        value = _finite(raw)
        passed = value is not None and value >= threshold
        shown = "no valid value" if value is None else f"{value:.4g} {unit}"
        verdict = "meets" if passed else "is below"
        results.append(
            GateResult(
                name=name,
                subject=subject,
                threshold=threshold,
                value=value,
                passed=passed,
                detail=f"{shown} {verdict} the minimum {threshold:g} {unit}"
                if value is not None
                else f"{shown}: the minimum {threshold:g} {unit} is not shown",
            )
        )
    return results


def maximum_gates(
    name: str, threshold: float, values: Iterable[tuple[str, float | None]], unit: str
) -> list[GateResult]:
    """One result per subject: passes when value <= threshold (latencies)."""
    results = []
    for subject, raw in values:
        value = _finite(raw)
        passed = value is not None and value <= threshold
        detail = (
            f"no valid value: the maximum {threshold:g} {unit} is not shown"
            if value is None
            else f"{value:.4g} {unit} {'is within' if passed else 'exceeds'} the maximum {threshold:g} {unit}"
        )
        results.append(
            GateResult(name=name, subject=subject, threshold=threshold, value=value, passed=passed, detail=detail)
        )
    return results


def _finite(value: float | None) -> float | None:
    """A NaN or infinite value shows nothing: it is gated as a missing one."""
    return value if value is not None and math.isfinite(value) else None


def failed(gates: Iterable[GateResult]) -> list[GateResult]:
    return [gate for gate in gates if not gate.passed]


def enforce_gates(section: str, gates: list[GateResult], *, report: str) -> None:
    """Exit 1 (CheckFailed) when a gate of `section` failed; `report` names where every value is kept."""
    bad = failed(gates)
    if bad:
        names = ", ".join(f"{g.name} ({g.subject})" for g in bad)
        raise CheckFailed(
            f"{section}: {len(bad)} of {len(gates)} gates failed: {names}",
            fix=f"{report} keeps every value and reason",
        )
