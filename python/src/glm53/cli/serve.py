"""`glm53 serve`: the request from the command line -> `glm53.serve.start` (dry run or exec)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    RigOpt,
    SetOpt,
)
from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.output import Output
from glm53.recipe.profiles import DEFAULT_PROFILE
from glm53.serve import start
from glm53.serve.render import render_dry_run
from glm53.serve.resolve import ServeRequest


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
    rig: RigOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print exactly the command, environment and CPU affinity; start nothing."),
    ] = False,
    skip_preflight: Annotated[bool, typer.Option("--skip-preflight", help="Do not run doctor's checks first.")] = False,
    skip_flag_check: Annotated[
        bool, typer.Option("--skip-flag-check", help="Do not check the flags against vLLM's own parser.")
    ] = False,
    capture_routing: Annotated[
        Path | None,
        typer.Option(
            "--capture-routing",
            metavar="DIR",
            help=(
                "exllamav3 profiles: record the engine's routing into DIR while it serves (routing.npz, a trace "
                "for `glm53 plan`; capture.npz where the dynamic CPU split runs). A new directory: an earlier "
                "capture is never replaced."
            ),
        ),
    ] = None,
    exec_in_place: Annotated[
        bool,
        typer.Option(
            "--exec",
            help=(
                "Replace glm53 with the engine: its PID and every signal are the engine's, and no stage lines are "
                "printed. Without it the engine runs as glm53's child, each stage of its start reported with its "
                "time, signals passed on, and glm53 ends as the engine does."
            ),
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Serve a checkpoint: check the host, plan its expert pools, start the profile's engine.

    vLLM profiles run `vllm serve`; exllamav3 profiles (exl3-*) write TabbyAPI's config and run TabbyAPI with
    ExLlamaV3. Each stage of the start (plan, config, the engine's load, first health) prints one line with its
    time; --exec replaces glm53 with the engine instead. A GPU profile without --plan-env is planned on this host
    first (--rig plans another machine). --dry-run shows exactly what that start would run (argv, environment,
    CPU affinity, config file), each value with its origin.

    Examples:
      glm53 serve --model-dir /models/glm53 --profile agent-256k
      glm53 serve --profile agent-256k --dry-run
      glm53 serve --profile exl3-2x3090 --rig recipe-2x3090 --dry-run
      glm53 serve --model-dir DIR --set MAX_MODEL_LEN=131072 --api-key-file ~/.config/glm53/key
      glm53 serve --profile cpu-tiny --model-dir ~/.cache/glm53/demo/glm53-tiny --port 8001
      glm53 serve --profile exl3-1gpu --model-dir DIR --capture-routing ~/glm53-routing/today
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
        rig=rig,
        skip_preflight=skip_preflight,
        skip_flag_check=skip_flag_check,
        capture_routing=capture_routing,
        exec_in_place=exec_in_place,
    )
    out = Output(json_mode=json_out)
    if dry_run:
        result = start.dry_run(req, out)
        out.result(result, lambda console: render_dry_run(console, result))
        return
    start.start(req, out)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
