"""`glm53 router`: a fleet file -> vLLM's router (vllm-router) in front of glm53 servers (dry run or exec)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.cli.options import FleetFileArg, JsonOpt, ListenAllOpt, RouterApiKeyFileOpt, SkipProbeOpt
from glm53.output import Output
from glm53.router import start
from glm53.router.render import render_dry_run


def router_cmd(
    fleet_file: FleetFileArg,
    listen_all: ListenAllOpt = False,
    api_key_file: RouterApiKeyFileOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print exactly the router's command and environment; start nothing.")
    ] = False,
    skip_flag_check: Annotated[
        bool, typer.Option("--skip-flag-check", help="Do not check the flags against vllm-router's own parser.")
    ] = False,
    skip_probe: SkipProbeOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Route requests over a fleet of glm53 servers with vLLM's router (vllm-router).

    The fleet file (TOML or JSON) lists the backends and the settings; the defaults keep one request per
    backend at a time, every session on its backend (X-Session-ID header), the rest queued in the router, and
    retry a request whose backend died on another one (docs/router.md). Before exec, every flag is checked
    against the installed router's parser and every backend must answer /health.

    Examples:
      glm53 router fleet.toml
      glm53 router fleet.toml --dry-run --json
      glm53 router fleet.toml --listen-all --api-key-file /etc/glm53/router-key
    """
    req = start.RouterRequest(
        fleet_file=Path(fleet_file),
        listen_all=listen_all,
        api_key_file=api_key_file,
        skip_flag_check=skip_flag_check,
        skip_probe=skip_probe,
    )
    out = Output(json_mode=json_out)
    if dry_run:
        result = start.dry_run(req, out)
        out.result(result, lambda console: render_dry_run(console, result))
        return
    start.start(req, out)


def register(app: typer.Typer) -> None:
    app.command("router")(router_cmd)
