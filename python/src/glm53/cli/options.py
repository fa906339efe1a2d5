"""Option aliases shared by every command: one help string per concept."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output file.")]
ModelDirArg = Annotated[Path, typer.Argument(help="The checkpoint directory.", show_default=False)]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="Checkpoint lock file (default: DIR/checkpoint.lock.json)."),
]
RevisionOpt = Annotated[str, typer.Option("--revision", help="Full 40-hex commit of the Hub repository.")]
