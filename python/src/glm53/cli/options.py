"""Option aliases shared by every command: one spelling and one help string per concept."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.serve.profiles import PROFILE_NAMES

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output file.")]
ModelDirArg = Annotated[Path, typer.Argument(help="The checkpoint directory.", show_default=False)]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="Checkpoint lock file (default: DIR/checkpoint.lock.json)."),
]
RevisionOpt = Annotated[str, typer.Option("--revision", help="Full 40-hex commit of the Hub repository.")]
# The checkpoint directory, spelled the same in every command that takes one.
ModelDirOpt = Annotated[
    Path | None,
    typer.Option("--model-dir", "-m", help="The checkpoint directory.", show_default=False),
]
ProfileOpt = Annotated[
    str, typer.Option("--profile", "-p", help=f"Serving profile: {', '.join(PROFILE_NAMES)}.")
]
HostOpt = Annotated[
    str, typer.Option("--host", help="Address to listen on (not loopback: add --listen-all).")
]
PortOpt = Annotated[int, typer.Option("--port", help="Port to listen on.")]
ListenAllOpt = Annotated[bool, typer.Option("--listen-all", help="Allow a --host other than loopback.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override one profile key (repeatable)."),
]
EnvFileOpt = Annotated[
    Path | None,
    typer.Option("--env-file", help="KEY=VALUE file over the profile (an existing recipe .env works)."),
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-key-file", help="File holding the API key; passed to vLLM as VLLM_API_KEY, never in argv."
    ),
]
PlanEnvOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan-env",
        help="Host plan as KEY=VALUE lines (`glm53 plan --env`); HYBRID_MAIN_CPUS pins vLLM's CPUs.",
    ),
]


