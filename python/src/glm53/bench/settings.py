"""What each bench command is asked to do: one settings model per kind (`bench run`, `needle`, `coherence`,
`agent` and `compare`), each field one of the command's options, its default and description written here
once. The server measured is glm53.bench.target.Target; the CLI builds its options from both.

The gates are shared: `--fail-under` (Minimums), `--fail-over` (Maximums) and `--report-only` (ReportOnly) are
declared once, and a kind takes those it has; its FAIL_UNDER and FAIL_OVER name the values it gates (key ->
meaning), which its options' descriptions list and its thresholds are held to. `gates(section)` evaluates a
kind's thresholds on what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from glm53.bench.agent import (
    AGENT_FAIL_OVER,
    AGENT_FAIL_UNDER,
    AgentSection,
    agent_gates,
)
from glm53.bench.agent import DEFAULT_MAX_TOKENS as AGENT_MAX_TOKENS
from glm53.bench.agent import DEFAULT_SYSTEM_TOKENS as AGENT_SYSTEM_TOKENS
from glm53.bench.coherence import DEFAULT_MAX_TOKENS as COHERENCE_MAX_TOKENS
from glm53.bench.coherence import CoherenceSection, coherence_gates
from glm53.bench.compare import COMPARE_FAIL_OVER, COMPARE_FAIL_UNDER, compare_gates
from glm53.bench.gates import GateResult
from glm53.bench.needle import (
    DEFAULT_DEPTHS,
    DEFAULT_SIZES,
    MAX_SIZE_TOKENS,
    MIN_SIZE_TOKENS,
    NEEDLE_FAIL_UNDER,
    NeedleSection,
    needle_gates,
)
from glm53.bench.needle import DEFAULT_MAX_TOKENS as NEEDLE_MAX_TOKENS
from glm53.bench.prompts import PromptStyle
from glm53.bench.report import Summary
from glm53.bench.runner import (
    DEFAULT_RETRIES,
    DEFAULT_RUNS,
    DEFAULT_SHAPES,
    RUN_FAIL_OVER,
    RUN_FAIL_UNDER,
    RunSection,
    Shape,
    run_gates,
)

# The gate fields, in the order a command lists them after its own.
GATE_FIELDS = ("fail_under", "fail_over", "report_only")
Thresholds = dict[str, float]


def describe_thresholds(kind: str, allowed: Mapping[str, str], subject: str = "") -> str:
    """'Minimums, KEY=NUMBER[,...]: decode (best decode tok/s of every shape), ...' for a kind's keys."""
    keys = ", ".join(f"{key} ({meaning})" for key, meaning in allowed.items())
    return f"{kind}{subject}, KEY=NUMBER[,...]: {keys}."


def format_thresholds(values: Mapping[str, float]) -> str:
    """{"decode": 45.0} -> 'decode=45' (what glm53.bench.gates.parse_thresholds reads back)."""
    return ",".join(f"{key}={value:g}" for key, value in values.items())


def _check_thresholds(values: Thresholds, allowed: Mapping[str, str], what: str) -> Thresholds:
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not {what} of this command (keys: {', '.join(allowed)})")
    bad = sorted(key for key, value in values.items() if not math.isfinite(value))
    if bad:
        raise ValueError(f"{', '.join(bad)}: not a finite number")
    return values


class BenchSettings(BaseModel):
    """What every kind shares: the values it may gate (none here), how its gates are enforced."""

    model_config = ConfigDict(frozen=True)

    FAIL_UNDER: ClassVar[Mapping[str, str]] = {}
    FAIL_OVER: ClassVar[Mapping[str, str]] = {}
    # Said after "Minimums"/"Maximums" in the gate options' descriptions, e.g. " on the candidate".
    GATED: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # Each kind's gate options list its own keys: their descriptions are made from its FAIL_UNDER/FAIL_OVER
        # (every class holds its own copy of an inherited field's FieldInfo), and the schema rebuilt with them.
        described = {
            field: describe_thresholds(kind, allowed, cls.GATED)
            for field, kind, allowed in (
                ("fail_under", "Minimums", cls.FAIL_UNDER),
                ("fail_over", "Maximums", cls.FAIL_OVER),
            )
            if field in cls.model_fields and allowed
        }
        for field, description in described.items():
            cls.model_fields[field].description = description
        if described:
            cls.model_rebuild(force=True)

    def gates(self, section: Any) -> list[GateResult]:
        """The kind's thresholds evaluated on what it measured (its section; compare: the candidate report)."""
        raise NotImplementedError

    @property
    def enforced(self) -> bool:
        """Whether a failed gate exits 1 (not with --report-only)."""
        return not getattr(self, "report_only", False)


class Minimums(BenchSettings):
    fail_under: Thresholds = Field(default_factory=dict, description="Minimums, KEY=NUMBER[,...].")

    @field_validator("fail_under")
    @classmethod
    def _known_minimums(cls, value: Thresholds) -> Thresholds:
        return _check_thresholds(value, cls.FAIL_UNDER, "a minimum")


class Maximums(BenchSettings):
    fail_over: Thresholds = Field(default_factory=dict, description="Maximums, KEY=NUMBER[,...].")

    @field_validator("fail_over")
    @classmethod
    def _known_maximums(cls, value: Thresholds) -> Thresholds:
        return _check_thresholds(value, cls.FAIL_OVER, "a maximum")


class ReportOnly(BenchSettings):
    report_only: bool = Field(False, description="Report failing gates without exiting non-zero.")


class RunSettings(Minimums, Maximums):
    """`glm53 bench run`: throughput, best of `runs` per shape."""

    FAIL_UNDER = RUN_FAIL_UNDER
    FAIL_OVER = RUN_FAIL_OVER

    shapes: tuple[Shape, ...] | None = Field(
        None,
        min_length=1,
        description="PROMPT:OUTPUT token counts, comma-separated. Default: the recipe's "
        f"{DEFAULT_SHAPES}, those that fit the server's max_model_len (when none does, one shape of half of it).",
    )
    runs: int = Field(DEFAULT_RUNS, ge=1, description="Runs per shape; the best is reported, all kept.")
    retries: int = Field(
        DEFAULT_RETRIES,
        ge=0,
        description="Extra runs per shape in place of runs rejected for implausible timing (a stream the client "
        "cannot time and the engine's /metrics cannot vouch for); the rejected runs stay in the report.",
    )
    style: PromptStyle = Field("prose", description="Prompt style: prose (tiled text) or random ids.")
    plots: bool = Field(True, description="Write TTFT and decode PNGs into --out.")

    def gates(self, section: RunSection) -> list[GateResult]:
        return run_gates(section, self.fail_under, self.fail_over)


class NeedleSettings(Minimums, ReportOnly):
    """`glm53 bench needle`: an exact JSON record at each depth of each prompt size, asked back."""

    FAIL_UNDER = NEEDLE_FAIL_UNDER

    sizes: tuple[Annotated[int, Field(ge=MIN_SIZE_TOKENS, le=MAX_SIZE_TOKENS)], ...] = Field(
        DEFAULT_SIZES, min_length=1, description="Prompt sizes in tokens, comma-separated."
    )
    depths: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] = Field(
        DEFAULT_DEPTHS, min_length=1, description="Needle depths, fractions of the prompt."
    )
    max_tokens: int = Field(NEEDLE_MAX_TOKENS, ge=8, description="Answer budget per question.")

    def gates(self, section: NeedleSection) -> list[GateResult]:
        return needle_gates(section, self.fail_under)


class CoherenceSettings(ReportOnly):
    """`glm53 bench coherence`: three probes a working deployment answers, each its own gate."""

    max_tokens: int = Field(COHERENCE_MAX_TOKENS, ge=8, description="Token budget per answer (thinking included).")

    def gates(self, section: CoherenceSection) -> list[GateResult]:
        return coherence_gates(section)


class AgentSettings(Minimums, Maximums):
    """`glm53 bench agent`: the scripted multi-turn tool-use sessions."""

    FAIL_UNDER = AGENT_FAIL_UNDER
    FAIL_OVER = AGENT_FAIL_OVER

    tasks: int | None = Field(None, ge=1, description="Run the first N of the scripted tasks (default: all).")
    system_tokens: int = Field(AGENT_SYSTEM_TOKENS, ge=0, description="Size of the shared system prompt, in tokens.")
    max_tokens: int = Field(AGENT_MAX_TOKENS, ge=2, description="Token budget per turn.")

    def gates(self, section: AgentSection) -> list[GateResult]:
        return agent_gates(section, self.fail_under, self.fail_over)


class CompareSettings(Minimums, Maximums):
    """`glm53 bench compare`: with thresholds, a gate on the candidate (B, or the one report)."""

    FAIL_UNDER = COMPARE_FAIL_UNDER
    FAIL_OVER = COMPARE_FAIL_OVER
    GATED = " on the candidate (B, or the one report)"

    @property
    def gated(self) -> bool:
        return bool(self.fail_under or self.fail_over)

    def gates(self, candidate: Summary) -> list[GateResult]:
        return compare_gates(candidate, self.fail_under, self.fail_over)


__all__ = [
    "GATE_FIELDS",
    "AgentSettings",
    "BenchSettings",
    "CoherenceSettings",
    "CompareSettings",
    "Maximums",
    "Minimums",
    "NeedleSettings",
    "ReportOnly",
    "RunSettings",
    "describe_thresholds",
    "format_thresholds",
]
