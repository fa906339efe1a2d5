"""`glm53 profile`: list the profiles, and check a profile with its overrides without starting anything.

`profile check` is what the NixOS module runs at build time on the settings it renders, so a typo'd key
fails `nixos-rebuild` rather than the service start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from glm53.cli.options import EnvFileOpt, JsonOpt, ProfileOpt, SetOpt
from glm53.output import Output
from glm53.serve.profiles import DEFAULT_PROFILE, PROFILE_NAMES, load_profile, parse_set_options, read_env_file

profile_app = typer.Typer(help="List and check serving profiles.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")


@profile_app.command("list")
def list_profiles(json_out: JsonOpt = False) -> None:
    """The packaged profiles and what each is for."""
    rows = [{"name": name, "default": name == DEFAULT_PROFILE,
             "description": load_profile(name, environ={}).description} for name in PROFILE_NAMES]

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
    use_environment: Annotated[
        bool, typer.Option("--use-environment/--no-environment", help="Apply this process's environment too.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Validate a profile with an env file and --set overrides; print every value and where it came from."""
    loaded = load_profile(
        profile,
        environ=dict(os.environ) if use_environment else {},
        env_file=read_env_file(Path(env_file)) if env_file else None,
        overrides=parse_set_options(set_values or []),
    )
    rows = [{"key": s.key, "value": s.value, "origin": s.origin, "source": s.source}
            for s in loaded.settings.values()]

    def render(console: Console) -> None:
        table = Table(title=f"profile {loaded.name}: valid")
        for column in ("key", "value", "origin"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["key"], row["value"], row["source"])
        console.print(table)

    Output(json_mode=json_out).result({"profile": loaded.name, "valid": True, "settings": rows}, render)
