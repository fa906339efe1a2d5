"""`glm53 probe`: measure host->device bandwidth for the planner (needs an NVIDIA GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.options import OUT_POLICY, ForceOpt, JsonOpt, refuse_to_replace
from glm53.errors import BadInput
from glm53.fsutil import atomic_write_json
from glm53.host.probe import timed_probe
from glm53.output import Output
from glm53.plan.cache.render import render_probe
from glm53.plan.finite import require_finite


def probe(
    block_bytes: Annotated[int, typer.Option("--block-bytes", min=1, help="Bytes per copy (one expert).")] = 9_474_060,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Copies timed per memory kind.")] = 50,
    device: Annotated[int, typer.Option("--device", min=0, help="CUDA device index.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON report here." + OUT_POLICY)] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Host->device bandwidth from pinned, pageable and mapped (UVA) memory at expert-sized blocks.

    Examples:
      glm53 probe --out probe.json
      glm53 probe --device 1 --repeats 100 --json
    """

    output = Output(json_mode=json_mode)
    if out is not None and out.is_dir():
        raise BadInput(f"--out {out} is a directory", fix="give the report file's path, e.g. --out probe.json")
    if out is not None:
        refuse_to_replace([out], force=force)
    report, seconds = timed_probe(block_bytes, repeats, device)
    require_finite(report.model_dump(mode="json"), what="the probe report")
    if out is not None:
        atomic_write_json(out, report.model_dump(mode="json"))
        output.info(f"wrote {out}")
    output.result(report, lambda console: render_probe(report, block_bytes, seconds, console))


def register(app: typer.Typer) -> None:
    app.command("probe")(probe)
