"""`glm53 profile`: list the profiles, and check a profile with its overrides without starting anything.

`profile check` is what the NixOS module runs at build time on the settings it renders, so a typo'd key
fails `nixos-rebuild` rather than the service start.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.options import EnvFileOpt, HostOpt, JsonOpt, ListenAllOpt, PortOpt, ProfileOpt, SetOpt
from glm53.output import Output
from glm53.recipe.profiles import DEFAULT_PROFILE, PROFILE_NAMES, load_profile
from glm53.serve.launch import DEFAULT_HOST, DEFAULT_PORT
from glm53.serve.render import render_settings
from glm53.serve.resolve import ServeRequest, resolve_launch

profile_app = typer.Typer(help="List and check serving profiles.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")


@profile_app.command("list")
def list_profiles(json_out: JsonOpt = False) -> None:
    """The packaged profiles and what each is for."""
    rows = [
        {"name": name, "default": name == DEFAULT_PROFILE, "description": load_profile(name, environ={}).description}
        for name in PROFILE_NAMES
    ]

    def render(console: Console) -> None:
        table = Table(title="profiles")
        table.add_column("name")
        table.add_column("description")
        for row in rows:
            table.add_row(str(row["name"]) + (" (default)" if row["default"] else ""), str(row["description"]))
        console.print(table)

    Output(json_mode=json_out).result(rows, render)


@profile_app.command("check")
def check(
    profile: ProfileOpt = DEFAULT_PROFILE,
    env_file: EnvFileOpt = None,
    set_values: SetOpt = None,
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    listen_all: ListenAllOpt = False,
    use_environment: Annotated[
        bool, typer.Option("--use-environment/--no-environment", help="Apply this process's environment too.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Resolve a launch from a profile, an env file, --set overrides and the address, as `serve` would on the
    serving host (nothing of this host is read, nothing starts); print every value and where it came from.

    The NixOS module runs it at build time on the settings it renders: a bad key, value or address fails the
    system build, not the service start.
    """
    req = ServeRequest(
        profile=profile,
        env_file=env_file,
        set_values=set_values or [],
        host=host,
        port=port,
        listen_all=listen_all,
    )
    launch = resolve_launch(req, plan_here=False, need_model=False, environ=None if use_environment else {})
    rows = [
        {"key": s.key, "value": s.value, "origin": s.origin, "source": s.source}
        for s in launch.profile.settings.values()
    ]
    payload = {
        "profile": profile,
        "valid": True,
        "settings": rows,
        "argv": launch.spec.argv,
        "plan": launch.plan.model_dump(mode="json"),
    }
    Output(json_mode=json_out).result(payload, lambda console: render_settings(console, launch))
