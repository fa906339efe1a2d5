"""`glm53 doctor`: is this host ready to serve a profile? One line per check, each failure with its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.options import JsonOpt
from glm53.errors import CheckFailed, Unavailable
from glm53.host.doctor import ENGINE_LIBRARIES_CHECK, DoctorReport
from glm53.output import Output
from glm53.serve.launch import DEFAULT_HOST, DEFAULT_PORT
from glm53.serve.profiles import DEFAULT_PROFILE, PROFILE_NAMES

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def render_report(console: Console, report: DoctorReport) -> None:
    table = Table(title=f"glm53 doctor — profile {report.profile}", title_justify="left")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail")
    table.add_column("fix")
    for check in report.checks:
        style = _STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status}[/{style}]", check.detail, check.fix or "")
    console.print(table)
    failed = len(report.failures)
    console.print(
        "[green]ready[/green]" if report.ok else f"[bold red]{failed} check(s) failed[/bold red]",
        highlight=False,
    )


def doctor_cmd(
    profile: Annotated[
        str, typer.Option("--profile", "-p", help=f"Check for this profile: {', '.join(PROFILE_NAMES)}.")
    ] = DEFAULT_PROFILE,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir", "-m", help="Also verify this checkpoint (lock + stat cache) and its index."
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address the server will listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port the server will listen on.")] = DEFAULT_PORT,
    root: Annotated[
        Path,
        typer.Option(
            "--root", help="Read /proc, /sys and /dev/shm under this root (a container's or a saved tree)."
        ),
    ] = Path("/"),
    json_out: JsonOpt = False,
) -> None:
    """Check the engine's libraries, GPUs (NVML), memory, memlock, /dev/shm, THP, CPU, kernel, port, checkpoint.

    Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 3 when the engine cannot load
    (a shared library it links is missing).

    Examples:
      glm53 doctor
      glm53 doctor --profile cpu-tiny --port 8001
      glm53 doctor --model-dir /models/glm53 --json
    """
    from glm53.host.doctor import read_facts, requirements_for, run_checks
    from glm53.serve.profiles import load_profile

    out = Output(json_mode=json_out)
    loaded = load_profile(profile, environ={})
    facts = read_facts(root, host=host, port=port, model_dir=model_dir)
    report = run_checks(facts, requirements_for(loaded), profile=profile)
    payload = report.model_dump(mode="json") | {"ok": report.ok, "facts": facts.model_dump(mode="json")}
    out.result(payload, lambda console: render_report(console, report))
    engine = next(c for c in report.checks if c.name == ENGINE_LIBRARIES_CHECK)
    if engine.status == "fail":
        raise Unavailable(engine.detail, hint=engine.fix)
    if not report.ok:
        raise CheckFailed(f"{len(report.failures)} check(s) failed: "
                          + ", ".join(c.name for c in report.failures), hint="see the fix column")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
