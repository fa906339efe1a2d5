"""docs/cli.md, generated from the commands' own --help: the reference cannot drift from the code.

    python -m glm53.cli.reference            write docs/cli.md (atomically)
    python -m glm53.cli.reference --check    exit 1 when docs/cli.md differs from what --help says now

The help is rendered at a fixed width without colour, so the text is the same on every machine; a test
and `make lint` run the check.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from glm53.cli.main import app
from glm53.fsutil import atomic_write_text

REFERENCE = Path(__file__).resolve().parents[4] / "docs" / "cli.md"
WIDTH = 100
HEADER = """# Command reference

Generated from each command's `--help` by `python -m glm53.cli.reference` (`make cli-docs`); a test fails when
this file and the code disagree. Every command takes `--help`; reporting commands take `--json`.

Exit codes: 0 done, 1 a check failed, 2 bad input (nothing was changed), 3 the environment cannot do it (a
program, a GPU, a server missing), 128 + N when signal N ended the command (143: SIGTERM); on SIGTERM, SIGHUP
and Ctrl-C every child process is killed and every temp file removed first.

Outputs (`--out`, `-o`): written atomically, through a temp file in the same directory and a rename. A symlink
is written through to its target; a directory, FIFO, device or socket where a file goes is refused (exit 2), so
`--out /dev/stdout` is refused: leave `--out` out to print. Paths: a name longer than 255 bytes or a path longer
than 4096 is refused (exit 2) before the command runs. Names, values and server answers are shown with control
and bidi characters escaped (`\\x1b`, `\\u202e`) and a URL's password masked (`user:***@`).
"""


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and group under `command`, depth first, in the order `--help` lists them.

    Duck-typed on Click's Group interface: Typer ships its own copy of Click's classes."""
    yield path
    if hasattr(command, "list_commands"):
        context = command.context_class(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                yield from command_paths(sub, (*path, name))


def help_text(app: typer.Typer, path: tuple[str, ...], runner: CliRunner | None = None) -> str:
    """`glm53 PATH --help` as the reference shows it: WIDTH columns, no colour, trailing spaces removed."""
    env = {"TERMINAL_WIDTH": str(WIDTH), "COLUMNS": str(WIDTH), "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    result = (runner or CliRunner()).invoke(app, [*path, "--help"], env=env, prog_name="glm53")
    if result.exit_code != 0:
        raise RuntimeError(f"glm53 {' '.join(path)} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())


def render_reference(app: typer.Typer) -> str:
    root = typer.main.get_command(app)
    runner = CliRunner()
    sections = [HEADER]
    for path in command_paths(root):
        title = " ".join(("glm53", *path))
        sections.append(f"## `{title}`\n\n```text\n{help_text(app, path, runner)}\n```\n")
    return "\n".join(sections)


def main(argv: list[str]) -> int:
    text = render_reference(app)
    if "--check" in argv:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else ""
        if current != text:
            sys.stderr.write(f"{REFERENCE} is out of date: run `make cli-docs` and commit it\n")
            return 1
        return 0
    atomic_write_text(REFERENCE, text)
    sys.stderr.write(f"wrote {os.path.relpath(REFERENCE)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
