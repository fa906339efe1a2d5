"""The synthetic trace a `plan trace synth` wrote, as a line (human output; `--json` prints the model)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from glm53.plan.routing.traces import SyntheticTraceSpec


def render_synthetic_trace(path: Path, spec: SyntheticTraceSpec, console: Console) -> None:
    console.print(
        f"wrote {path}: {spec.steps:,} steps x {len(spec.layers)} layers x top-{spec.top_k} of {spec.experts}"
    )
