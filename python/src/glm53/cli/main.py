"""Wires the per-noun command modules into one `glm53` app; errors become exit codes here, once.

Nothing the command modules import loads a heavy dependency (torch, vLLM, numpy, matplotlib, huggingface_hub)
at import time, so `glm53 --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

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
from glm53.cli.guard import check_path_arguments
from glm53.errors import Glm53Error
from glm53.output import SafeConsole
from glm53.proc import Terminated, handle_termination

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
check_path_arguments(app)


def main() -> None:
    # Standalone mode keeps Click's own handling of usage errors (exit 2) and Ctrl-C; our errors pass
    # through it untouched and become their exit code here.
    try:
        # SIGTERM unwinds like Ctrl-C: children are killed and temp files removed on the way out.
        with handle_termination():
            app()
    except Terminated as exc:
        sys.exit(128 + exc.signum)
    except Glm53Error as exc:
        err = SafeConsole(stderr=True, soft_wrap=True)
        # A message quotes paths and values from outside: markup in them is text, not style.
        err.print(f"[bold red]error:[/bold red] {escape(exc.message)}", highlight=False)
        if exc.fix:
            err.print(f"[dim]hint:[/dim] {escape(exc.fix)}", highlight=False)
        if os.environ.get("GLM53_DEBUG"):
            raise
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
