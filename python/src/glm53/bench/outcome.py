"""What each bench command prints with `--json`: where its report went, what it measured and its gates. Each
is the command's model; the CLI prints its dump (a NaN or an infinity as null, as in summary.json)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from glm53.bench.agent import AgentSection
from glm53.bench.coherence import CoherenceSection
from glm53.bench.compare import Comparison
from glm53.bench.gates import GateResult
from glm53.bench.needle import NeedleSection
from glm53.bench.runner import RunSection


class Measured(BaseModel):
    summary: str = Field(description="The summary.json the section was written to.")
    gates: list[GateResult] = Field(default_factory=list)


class RunOutcome(Measured):
    plots: list[str] = Field(default_factory=list)
    run: RunSection


class NeedleOutcome(Measured):
    needle: NeedleSection
    pass_rate: float


class CoherenceOutcome(Measured):
    coherence: CoherenceSection


class AgentOutcome(Measured):
    agent: AgentSection


class GatedComparison(Comparison):
    gated: str = Field(description="The report the gates were evaluated on.")
    gates: list[GateResult] = Field(default_factory=list)


__all__ = ["AgentOutcome", "CoherenceOutcome", "GatedComparison", "Measured", "NeedleOutcome", "RunOutcome"]
