"""What a synthetic routing trace is drawn from (`glm53 plan trace synth`'s options). Light on purpose
(pydantic only): the CLI builds its options from it; glm53.plan.routing.traces draws and writes the trace."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_EXPERTS = 32767  # expert ids are stored as int16


class SyntheticTraceSpec(BaseModel):
    """Per-layer Zipf popularity (skew drawn per layer from [skew_min, skew_max]) and temporal locality: each
    of a step's top_k slots repeats the previous step's expert in that slot with probability `locality`.
    Each field is an option of `glm53 plan trace synth`."""

    model_config = ConfigDict(frozen=True)

    layers: tuple[int, ...] = Field(default=tuple(range(3, 45)), description="MoE layer ids, list format.")
    experts: int = Field(default=288, gt=0, le=MAX_EXPERTS, description="Routed experts per layer.")
    top_k: int = Field(default=8, gt=0, description="Experts per token and layer.")
    steps: int = Field(default=20_000, gt=1, description="Decode steps (tokens).")
    locality: float = Field(
        default=0.3,
        ge=0.0,
        lt=1.0,
        allow_inf_nan=False,
        description="Chance a slot repeats the previous step's expert (below 1).",
    )
    skew_min: float = Field(
        default=0.4, ge=0.0, le=100.0, allow_inf_nan=False, description="Smallest per-layer Zipf skew."
    )
    skew_max: float = Field(
        default=1.2, ge=0.0, le=100.0, allow_inf_nan=False, description="Largest per-layer Zipf skew."
    )
    # numpy's generators take non-negative seeds
    seed: int = Field(default=0, ge=0, description="Random seed (same seed, same trace).")
    # Popularity shifts: (at, strength) = from step round(at x steps) on, a random `strength` share of each
    # layer's experts swap popularity among themselves (1.0: the whole ranking re-permuted).
    shifts: tuple[tuple[float, float], ...] = Field(
        default=(),
        description="Popularity shifts AT:STRENGTH[,...]: from AT (share of the steps) on, a STRENGTH share of "
        "each layer's experts swap popularity (1 = fully re-permuted).",
    )

    @field_validator("shifts")
    @classmethod
    def _shifts(cls, value: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        for at, strength in value:
            if not (0.0 < at < 1.0 and 0.0 <= strength <= 1.0):
                raise ValueError(f"shift {at}:{strength} needs 0 < at < 1 and 0 <= strength <= 1")
        return tuple(sorted(value))


class SynthesizedTrace(SyntheticTraceSpec):
    """What `glm53 plan trace synth` wrote, with the spec it drew the trace from."""

    trace: str
    counts: str | None = None
    shape: str | None = None  # a named trace shape (glm53.plan.routing.shapes), which sets locality, skew, drift


def format_shifts(shifts: Sequence[tuple[float, float]]) -> str:
    """((0.5, 1.0),) -> '0.5:1'; none -> 'none' (what parse_shifts reads back)."""
    return ",".join(f"{at:g}:{strength:g}" for at, strength in shifts) or "none"


__all__ = ["MAX_EXPERTS", "SynthesizedTrace", "SyntheticTraceSpec", "format_shifts"]
