"""Wires the per-noun command modules into one `glm53` app; errors become exit codes here, once.

Nothing the command modules import loads a heavy dependency (torch, vLLM, numpy, matplotlib, huggingface_hub)
at import time, so `glm53 --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

import glm53
from glm53.cli import (
    bench,
    demo,
    doctor,
    fleet,
    model,
    plan,
    probe,
    profile,
    repro,
    router,
    serve,
    systemd,
)
from glm53.cli.app import App
from glm53.errors import Glm53Error

app = App(
    name="glm53",
    help="Lock, verify, plan, launch and benchmark GLM-5.3-Flash (EXL3) with CPU expert offload.",
    no_args_is_help=True,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"glm53 {glm53.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print glm53's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    pass


# One command module per noun; each adds its commands (or its group) to the app.
for command in (model, serve, profile, doctor, demo, plan, probe, bench, repro, systemd, router, fleet):
    command.register(app)


def main() -> None:
    # Standalone mode keeps Click's own handling of usage errors (exit 2) and Ctrl-C; our errors pass
    # through it untouched and become their exit code here.
    try:
        app()
    except Glm53Error as exc:
        err = Console(stderr=True, soft_wrap=True)
        err.print(f"[bold red]error:[/bold red] {exc.message}", highlight=False)
        if exc.hint:
            err.print(f"[dim]hint:[/dim] {exc.hint}", highlight=False)
        if os.environ.get("GLM53_DEBUG"):
            raise
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
