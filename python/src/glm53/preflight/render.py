"""The check report as a person reads it: one row per check, each failure with its fix."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from glm53.preflight.doctor import DoctorReport

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def render_report(console: Console, report: DoctorReport, title: str) -> None:
    table = Table(title=title, title_justify="left")
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
