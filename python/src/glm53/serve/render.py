"""The dry run as a person reads it: the environment, the CPU affinity and the command, then every profile
value with where it came from, and the host plan's status."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from glm53.host.topology import format_cpu_list
from glm53.serve.engines import engine_of
from glm53.serve.resolve import Launch
from glm53.serve.start import DryRun


def render_dry_run(console: Console, result: DryRun) -> None:
    spec = result.launch
    console.print("[bold]# environment[/bold] (exported on top of the current one)", highlight=False)
    for key, value in spec.env.items():
        console.print(f"{key}={shlex.quote(value)}  [dim]# {spec.origins.get(key, '')}[/dim]", highlight=False)
    engine = engine_of(spec.engine)
    key_in_env, key_in_file = engine.api_key_lines(spec)
    if key_in_env:
        console.print(key_in_env, highlight=False)
    if spec.cpu_affinity:
        console.print(f"[bold]# CPU affinity[/bold] {format_cpu_list(spec.cpu_affinity)}", highlight=False)
    for name, text in spec.files.items():
        console.print(f"[bold]# {spec.cwd}/{name}[/bold] (written 0600 before the start)", highlight=False)
        console.print(text.rstrip(), highlight=False, markup=False)
        console.print("[bold]# where each config field came from[/bold]", highlight=False)
        for key, origin in spec.origins.items():
            if key.startswith("config "):
                console.print(f"{key.removeprefix('config ')}  [dim]# {origin}[/dim]", highlight=False)
    if key_in_file:
        console.print(f"[bold]# {key_in_file}[/bold] <from --api-key-file, not shown>", highlight=False)
    if spec.cwd:
        console.print(f"[bold]# working directory[/bold] {spec.cwd}", highlight=False)
    console.print("[bold]# command[/bold]", highlight=False)
    console.print(" \\\n  ".join(_argv_lines(spec.argv)), highlight=False, markup=False)
    table = Table(title="profile values", title_justify="left")
    table.add_column("key")
    table.add_column("value")
    table.add_column("from")
    for key, info in result.values.items():
        if info["value"] != "":
            table.add_row(key, info["value"], info["source"])
    console.print(table)
    plan = result.plan
    if plan.source in ("impossible", "not planned"):
        console.print(
            f"[yellow]host plan: {plan.detail}[/yellow]; a start on the GPU host plans "
            + ", ".join(plan.keys)
            + " (shown above with the profile's values)",
            highlight=False,
        )
    else:
        console.print(f"host plan: {plan.detail}", highlight=False)
    console.print(engine.check_line(result.flag_check), highlight=False)


def _argv_lines(argv: list[str]) -> list[str]:
    """The program up to the model path on the first line, then one flag (with its value) per line."""
    first_flag = next((i for i, item in enumerate(argv) if item.startswith("--")), len(argv))
    lines = [shlex.join(argv[:first_flag])] if first_flag else []
    for item in argv[first_flag:]:
        if lines and not item.startswith("--") and lines[-1].startswith("--") and " " not in lines[-1]:
            lines[-1] += " " + shlex.quote(item)
        else:
            lines.append(shlex.quote(item))
    return lines


def render_settings(console: Console, launch: Launch) -> None:
    """`profile check`: every value and its source, then the launch it resolves to."""
    table = Table(title=f"profile {launch.profile.name}: valid")
    for column in ("key", "value", "origin"):
        table.add_column(column, overflow="fold")
    for setting in launch.profile.settings.values():
        table.add_row(setting.key, setting.value, setting.source)
    console.print(table)
    console.print(
        f"host plan: {launch.plan.detail}" + (f" ({', '.join(launch.plan.keys)})" if launch.plan.keys else ""),
        highlight=False,
    )
    console.print(" \\\n  ".join(_argv_lines(launch.spec.argv)), highlight=False, markup=False)
