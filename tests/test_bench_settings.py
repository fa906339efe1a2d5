"""The bench settings models (glm53.bench.settings): each kind's options, defaults and gates in one place."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from glm53.bench.agent import run_agent
from glm53.bench.coherence import run_coherence
from glm53.bench.needle import run_needles
from glm53.bench.runner import run_benchmark
from glm53.bench.settings import (
    GATE_FIELDS,
    AgentSettings,
    CoherenceSettings,
    CompareSettings,
    NeedleSettings,
    RunSettings,
    format_thresholds,
)


def _default(function: Callable[..., object], name: str) -> object:
    return inspect.signature(function).parameters[name].default


def test_the_library_functions_default_to_the_settings_defaults() -> None:
    assert _default(run_benchmark, "retries") == RunSettings().retries
    assert _default(run_needles, "max_tokens") == NeedleSettings().max_tokens
    assert _default(run_coherence, "max_tokens") == CoherenceSettings().max_tokens
    assert _default(run_agent, "system_tokens") == AgentSettings().system_tokens
    assert _default(run_agent, "max_tokens") == AgentSettings().max_tokens
    assert AgentSettings().tasks is None  # every scripted task


def test_each_kind_has_the_gates_it_evaluates() -> None:
    def gates(model: type) -> set[str]:
        return set(model.model_fields) & set(GATE_FIELDS)

    assert gates(RunSettings) == gates(AgentSettings) == gates(CompareSettings) == {"fail_under", "fail_over"}
    assert gates(NeedleSettings) == {"fail_under", "report_only"}
    assert gates(CoherenceSettings) == {"report_only"}
    assert RunSettings().enforced and not NeedleSettings(report_only=True).enforced
    assert not CompareSettings().gated and CompareSettings(fail_over={"ttft": 5}).gated


def test_thresholds_are_held_to_the_kinds_keys_and_described_by_them() -> None:
    assert RunSettings(fail_under={"decode": 45}).fail_under == {"decode": 45.0}
    with pytest.raises(ValidationError, match="cache-hit: not a minimum of this command"):
        RunSettings(fail_under={"cache-hit": 60})
    with pytest.raises(ValidationError, match="not a finite number"):
        AgentSettings(fail_over={"turn-latency": float("nan")})
    for model in (RunSettings, AgentSettings, CompareSettings, NeedleSettings):
        described = model.model_fields["fail_under"].description or ""
        assert all(f"{key} (" in described for key in model.FAIL_UNDER), model
        assert model.model_json_schema()["properties"]["fail_under"]["description"] == described
    assert "on the candidate" in (CompareSettings.model_fields["fail_over"].description or "")
    assert format_thresholds({"decode": 45.0, "prefill": 1000.0}) == "decode=45,prefill=1000"


def test_needle_sizes_and_depths_are_bounded() -> None:
    with pytest.raises(ValidationError):
        NeedleSettings(sizes=(64,))
    with pytest.raises(ValidationError):
        NeedleSettings(depths=(1.5,))
    with pytest.raises(ValidationError):
        NeedleSettings(sizes=())
