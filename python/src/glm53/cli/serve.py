"""`glm53 serve`: profile -> preflight -> launch -> exec vLLM (or print it all with --dry-run)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from glm53.cli.options import (
    ApiKeyFileOpt,
    EnvFileOpt,
    HostOpt,
    JsonOpt,
    ListenAllOpt,
    ModelDirOpt,
    PlanEnvOpt,
    PortOpt,
    ProfileOpt,
    SetOpt,
)
from glm53.errors import BadInput
from glm53.output import Output
from glm53.serve.flags import FlagCheck
from glm53.serve.launch import DEFAULT_HOST, DEFAULT_PORT, LaunchSpec, PlanInput
from glm53.serve.profiles import DEFAULT_PROFILE, Profile

if TYPE_CHECKING:
    from glm53.plan.planner import GpuSpec

class ServeRequest(BaseModel):
    """Everything `serve` needs, as given on the command line (also built by `glm53 demo`)."""

    profile: str = DEFAULT_PROFILE
    model_dir: Path | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    listen_all: bool = False
    set_values: list[str] = []
    env_file: Path | None = None
    api_key_file: Path | None = None
    plan_env: Path | None = None
    skip_preflight: bool = False
    skip_flag_check: bool = False


class DryRun(BaseModel):
    launch: LaunchSpec
    command: str
    flag_check: FlagCheck
    values: dict[str, dict[str, str]]


def read_plan(path: Path) -> tuple[list[tuple[str, str, str]], PlanInput]:
    """The planner's KEY=VALUE file: profile keys (layered over the profile), the rest (exported as they are),
    and HYBRID_MAIN_CPUS as the serving CPUs."""
    from glm53.host.topology import parse_cpu_list
    from glm53.serve.profiles import KEYS, parse_env_text, read_env_file

    _, text = read_env_file(path)
    lines, _ = parse_env_text(text, source=str(path))
    values = [(line.key, line.value, f"plan {path}:{line.lineno}") for line in lines]
    others = {line.key: line.value for line in lines if line.key not in KEYS}
    cpus = others.get("HYBRID_MAIN_CPUS")
    affinity = list(parse_cpu_list(cpus, what=f"{path}: HYBRID_MAIN_CPUS")) if cpus else None
    return values, PlanInput(env=others, cpu_affinity=affinity)


PlanLayer = tuple[list[tuple[str, str, str]], PlanInput]


def plan_on_this_host(
    profile: Profile, model_dir: Path | None, *, gpus: list[GpuSpec] | None = None, root: Path = Path("/")
) -> PlanLayer:
    """What the recipe's entrypoint did before exec: plan the expert pools for this host and profile.

    Used when a GPU profile is served without --plan-env; the plan's values layer over the profile exactly as a
    `glm53 plan --env` file would.
    """
    from glm53.plan.env import plan_serving_env
    from glm53.serve.profiles import KEYS

    env, affinity = plan_serving_env(profile, model_dir=model_dir, gpus=gpus, root=root)
    values = [(key, value, "plan (this host)") for key, value in env.items() if key in KEYS]
    others = {key: value for key, value in env.items() if key not in KEYS}
    return values, PlanInput(env=others, cpu_affinity=list(affinity) or None)


def prepare(
    req: ServeRequest, *, dry_run: bool, plan_layer: PlanLayer | None = None
) -> tuple[LaunchSpec, str | None, Profile]:
    """Load the profile and inputs (bad input raises BadInput before anything starts); build the launch."""
    from glm53.serve.exec import read_api_key
    from glm53.serve.flags import vllm_command
    from glm53.serve.launch import build_launch
    from glm53.serve.profiles import load_profile, parse_set_options, read_env_file

    env_file = read_env_file(req.env_file) if req.env_file is not None else None
    if plan_layer is not None:
        plan_values, plan = plan_layer
    elif req.plan_env is not None:
        plan_values, plan = read_plan(req.plan_env)
    else:
        plan_values, plan = [], None
    profile = load_profile(
        req.profile,
        environ=os.environ,
        env_file=env_file,
        overrides=parse_set_options(req.set_values),
        plan=plan_values,
    )
    if req.model_dir is None:
        if not dry_run:
            raise BadInput(
                "serve needs the model directory", hint="glm53 serve --model-dir DIR (see glm53 model)"
            )
        model_dir: Path | str = "/model"
    else:
        model_dir = req.model_dir.resolve()
        if not dry_run and not model_dir.is_dir():
            raise BadInput(
                f"--model-dir: {req.model_dir} is not a directory",
                hint="download it with `glm53 model download`, or `glm53 demo` for the tiny model",
            )
    api_key = read_api_key(req.api_key_file) if req.api_key_file is not None else None
    spec = build_launch(
        profile,
        model_dir=model_dir,
        vllm_command=vllm_command(),
        host=req.host,
        port=req.port,
        listen_all=req.listen_all,
        plan=plan,
        api_key=api_key is not None,
    )
    return spec, api_key, profile


def preflight(req: ServeRequest, spec: LaunchSpec, profile: Profile, out: Output) -> None:
    """Run doctor's checks for this profile; any failure is bad input (exit 2) and nothing starts."""
    from glm53.host.doctor import read_facts, requirements_for, run_checks

    report = run_checks(
        read_facts(host=spec.host, port=spec.port, model_dir=req.model_dir),
        requirements_for(profile),
        profile=req.profile,
    )
    for check in report.checks:
        if check.status == "warn":
            out.warn(f"{check.name}: {check.detail}" + (f" (fix: {check.fix})" if check.fix else ""))
    if not report.ok:
        lines = [f"{c.name}: {c.detail}" for c in report.failures]
        fixes = [f"{c.name}: {c.fix}" for c in report.failures if c.fix]
        raise BadInput(
            "preflight failed, nothing started:\n  " + "\n  ".join(lines),
            hint="\n  ".join(fixes) or "run `glm53 doctor` for the whole report",
        )


def run_serve(req: ServeRequest, *, dry_run: bool = False, json_out: bool = False) -> None:
    from glm53.serve.exec import exec_launch
    from glm53.serve.flags import check_flags

    out = Output(json_mode=json_out)
    spec, api_key, profile = prepare(req, dry_run=dry_run)
    if not dry_run:
        from glm53.host.native_libs import require_engine_libraries

        require_engine_libraries()
    if dry_run:
        values = {
            key: {"value": s.value, "origin": s.origin, "source": s.source}
            for key, s in profile.settings.items()
        }
        flags = (
            check_flags(spec.argv)
            if not req.skip_flag_check
            else FlagCheck(checked=False, vllm_version=None, reason="--skip-flag-check")
        )
        result = DryRun(launch=spec, command=shlex.join(spec.argv), flag_check=flags, values=values)
        out.result(result, lambda console: _render_dry_run(console, result))
        return
    if not req.skip_preflight:
        preflight(req, spec, profile, out)
    from glm53.host.doctor import requirements_for

    if req.plan_env is None and requirements_for(profile).gpus > 0:
        layer = plan_on_this_host(profile, req.model_dir)
        spec, api_key, profile = prepare(req, dry_run=False, plan_layer=layer)
        out.info(f"planned expert pools for this host: {len(layer[0]) + len(layer[1].env)} values")
    if not req.skip_flag_check:
        check = check_flags(spec.argv)
        if check.checked:
            cached = " (cached)" if check.cached else ""
            out.info(f"flags accepted by {check.vllm_version}'s serve parser{cached}")
        else:
            out.warn(f"flags not checked: {check.reason}")
    out.info(f"serving {spec.profile} on {spec.base_url} (OpenAI API under {spec.base_url}/v1)")
    exec_launch(spec, api_key=api_key)


def _render_dry_run(console: Console, result: DryRun) -> None:
    spec = result.launch
    console.print("[bold]# environment[/bold] (exported on top of the current one)", highlight=False)
    for key, value in spec.env.items():
        console.print(
            f"{key}={shlex.quote(value)}  [dim]# {spec.origins.get(key, '')}[/dim]", highlight=False
        )
    if spec.api_key:
        console.print("VLLM_API_KEY=<from --api-key-file, not shown>", highlight=False)
    if spec.cpu_affinity:
        from glm53.host.topology import format_cpu_list

        console.print(f"[bold]# CPU affinity[/bold] {format_cpu_list(spec.cpu_affinity)}", highlight=False)
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
    check = result.flag_check
    if check.checked:
        console.print(
            f"flags: accepted by {check.vllm_version}'s serve parser" + (" (cached)" if check.cached else ""),
            highlight=False,
        )
    else:
        console.print(f"flags: not checked ({check.reason})", highlight=False)


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


def serve_cmd(
    model_dir: ModelDirOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    listen_all: ListenAllOpt = False,
    set_values: SetOpt = None,
    env_file: EnvFileOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    plan_env: PlanEnvOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command and environment; start nothing.")
    ] = False,
    skip_preflight: Annotated[
        bool, typer.Option("--skip-preflight", help="Do not run doctor's checks first.")
    ] = False,
    skip_flag_check: Annotated[
        bool, typer.Option("--skip-flag-check", help="Do not check the flags against vLLM's own parser.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Serve a checkpoint with vLLM: checks the host, then replaces this process with `vllm serve`.

    Examples:
      glm53 serve --model-dir /models/glm53 --profile agent-256k
      glm53 serve --profile agent-256k --dry-run
      glm53 serve --model-dir DIR --set MAX_MODEL_LEN=131072 --api-key-file ~/.config/glm53/key
      glm53 serve --profile cpu-tiny --model-dir ~/.cache/glm53/serve/demo/glm53-tiny --port 8001
    """
    req = ServeRequest(
        profile=profile,
        model_dir=model_dir,
        host=host,
        port=port,
        listen_all=listen_all,
        set_values=set_values or [],
        env_file=env_file,
        api_key_file=api_key_file,
        plan_env=plan_env,
        skip_preflight=skip_preflight,
        skip_flag_check=skip_flag_check,
    )
    run_serve(req, dry_run=dry_run, json_out=json_out)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
