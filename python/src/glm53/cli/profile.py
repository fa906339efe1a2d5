"""`glm53 profile`: list the profiles, and check a profile with its overrides without starting anything.

`profile check` is what the NixOS module runs at build time on the settings it renders, so a typo'd key
fails `nixos-rebuild` rather than the service start.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.app import App
from glm53.cli.options import EnvFileOpt, HostOpt, JsonOpt, ListenAllOpt, PortOpt, ProfileOpt, SetOpt
from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.output import Output
from glm53.recipe.profiles import DEFAULT_PROFILE, PROFILE_NAMES, load_profile
from glm53.serve.render import render_settings
from glm53.serve.resolve import ProfileCheck, ProfileSummary, ServeRequest, resolve_launch

profile_app = App(help="List and check serving profiles.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")


@profile_app.command("list")
def list_profiles(json_out: JsonOpt = False) -> None:
    """The packaged profiles and what each is for.

    Examples:
      glm53 profile list
      glm53 profile list --json
    """

    rows = [
        ProfileSummary(
            name=name, default=name == DEFAULT_PROFILE, description=load_profile(name, environ={}).description
        )
        for name in PROFILE_NAMES
    ]

    def render(console: Console) -> None:
        table = Table(title="profiles")
        table.add_column("name")
        table.add_column("description")
        for row in rows:
            table.add_row(row.name + (" (default)" if row.default else ""), row.description)
        console.print(table)

    Output(json_mode=json_out).result([row.model_dump(mode="json") for row in rows], render)


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

    Examples:
      glm53 profile check --profile agent-256k --set MAX_MODEL_LEN=131072
      glm53 profile check --profile exl3-2x3090 --env-file my.env --json
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
    result = ProfileCheck(
        profile=profile, settings=list(launch.profile.settings.values()), argv=launch.spec.argv, plan=launch.plan
    )
    Output(json_mode=json_out).result(result, lambda console: render_settings(console, launch))
