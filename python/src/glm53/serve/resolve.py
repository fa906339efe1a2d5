"""One resolution of a launch: request -> profile + plan + env file + environment + --set -> Launch.

    resolve_launch(request, plan_here=...) -> Launch     reads the files named, plans on this host if asked

`glm53 serve` (and its --dry-run), `glm53 demo` and `glm53 profile check` (the NixOS module's build-time
settings check) all call it, so what a dry run prints is exactly what a real start execs: the argv, the
exported environment and the CPU affinity, each value with its origin.

A GPU profile served without `--plan-env` is planned on this host, as the recipe's entrypoint did before
exec. Where that is impossible (no NVIDIA GPU), the launch says so and names the values a start on a GPU host
would plan: a dry run shows it, a real start stops (Unavailable, exit 3).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.errors import BadInput, Unavailable
from glm53.fsutil import GET_THE_CHECKPOINT, missing_directory
from glm53.host.topology import parse_cpu_list
from glm53.preflight.doctor import requirements_for
from glm53.recipe.profiles import (
    DEFAULT_PROFILE,
    KEYS,
    Profile,
    Setting,
    load_profile,
    parse_env_text,
    parse_set_options,
    read_env_file,
    unknown_key_error,
)
from glm53.serve.engines import SERVE_ENGINES, engine_of
from glm53.serve.engines.base import PLAN_THIS_HOST, LaunchInputs, PlanLayer
from glm53.serve.exec import api_key_file_warning, read_api_key
from glm53.serve.launch import LaunchSpec, PlanInput, is_loopback

# Where a dry run without --model-dir shows the checkpoint (the image mounts it there).
PLACEHOLDER_MODEL_DIR = "/model"


class ServeRequest(BaseModel):
    """Everything a launch is resolved from, as given on the command line (also built by `glm53 demo`)."""

    profile: str = DEFAULT_PROFILE
    model_dir: Path | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    listen_all: bool = False
    set_values: list[str] = []
    env_file: Path | None = None
    api_key_file: Path | None = None
    plan_env: Path | None = None
    # Read /proc and /sys under this root when planning (a saved host tree in tests and audits).
    root: Path = Path("/")
    skip_preflight: bool = False
    skip_flag_check: bool = False
    # Plan for a described rig (a packaged name or a JSON file) instead of this host: a dry run for the
    # machine the launch is meant for (exllamav3 profiles).
    rig: str | None = None
    # Record ExLlamaV3's routing into this directory while it serves (exllamav3 profiles).
    capture_routing: Path | None = None
    # Replace glm53 with the engine (its PID, its signals) instead of running it as a child that reports stages.
    exec_in_place: bool = False


class PlanStatus(BaseModel):
    """Where the host plan came from, or why there is none."""

    model_config = ConfigDict(frozen=True)

    source: Literal["plan-env", "this host", "rig", "not needed", "not planned", "impossible"]
    detail: str
    # Keys the plan set, or (not planned, impossible) the keys a real start would plan.
    keys: list[str] = []


class Launch(BaseModel):
    """A resolved launch: what exec gets, the layered profile it came from, and the plan's status."""

    model_config = ConfigDict(frozen=True)

    spec: LaunchSpec
    profile: Profile
    plan: PlanStatus
    # What deserves a word before the start, e.g. a server open to the network without an API key.
    warnings: list[str] = []
    # Read from --api-key-file; never dumped, never printed, never in argv.
    api_key: str | None = Field(default=None, exclude=True, repr=False)


class ProfileSummary(BaseModel):
    """A row of `glm53 profile list`."""

    name: str
    default: bool
    description: str


class ProfileCheck(BaseModel):
    """`glm53 profile check`'s result: every setting with its origin, the argv and the plan's status."""

    profile: str
    valid: bool = True
    settings: list[Setting]
    argv: list[str]
    plan: PlanStatus


# What a planner writes besides profile keys, per engine: vLLM's serving CPUs; ExLlamaV3's plan is all profile keys.
PLAN_ONLY_KEYS: dict[str, frozenset[str]] = {
    name: frozenset(k for k in engine.planned_keys if k not in KEYS) for name, engine in SERVE_ENGINES.items()
}


def read_plan(path: Path, engine: str | None = None) -> tuple[list[tuple[str, str, str]], PlanInput]:
    """The planner's KEY=VALUE file: profile keys (layered over the profile), the planner's own keys (exported
    as they are), and HYBRID_MAIN_CPUS as the serving CPUs. A key set twice, or one that is neither a profile
    key nor a key `engine`'s planner writes, is refused with the line that sets it."""
    _, text = read_env_file(path, flag="--plan-env")
    lines, _ = parse_env_text(text, source=str(path))
    first: dict[str, int] = {}
    for line in lines:
        where = f"--plan-env {path}:{line.lineno}"
        if line.key in first:
            raise BadInput(
                f"{where}: {line.key} is set again (first at line {first[line.key]})",
                fix="a plan file sets each key once: keep the value meant and remove the other line",
            )
        first[line.key] = line.lineno
        if line.key in KEYS:
            continue  # layered over the profile, which checks the key's engine
        owners = [name for name, keys in PLAN_ONLY_KEYS.items() if line.key in keys]
        if engine is not None and owners and engine not in owners:
            raise BadInput(
                f"{where}: {line.key} is written by the {' and '.join(owners)} planner, and this profile runs on "
                f"{engine}",
                fix=f"plan for this profile (glm53 plan host --profile NAME --env) or remove {line.key}",
            )
        if not owners:
            raise unknown_key_error(line.key, where=where)
    values = [(line.key, line.value, f"plan {path}:{line.lineno}") for line in lines]
    others = {line.key: line.value for line in lines if line.key not in KEYS}
    cpus = others.get("HYBRID_MAIN_CPUS")
    affinity = list(parse_cpu_list(cpus, what=f"{path}: HYBRID_MAIN_CPUS")) if cpus else None
    return values, PlanInput(env=others, cpu_affinity=affinity)


def plan_on_this_host(
    profile: Profile, model_dir: Path | None, *, root: Path = Path("/"), rig: str | None = None
) -> PlanLayer:
    """Plan the expert pools for this host (or the rig named) and profile; the values layer over the profile
    exactly as a `glm53 plan host --env` file would. GPUs come from NVML; Unavailable when there is none."""
    return engine_of(profile.engine).plan_here(profile, model_dir, root=root, rig=rig)


def _model_dir(req: ServeRequest, *, need_model: bool) -> Path | str:
    if req.model_dir is None:
        if need_model:
            raise BadInput("serve needs the model directory", fix="glm53 serve --model-dir DIR (see glm53 model)")
        return PLACEHOLDER_MODEL_DIR
    if need_model and (missing := missing_directory(req.model_dir)) is not None:
        raise BadInput(
            f"--model-dir {req.model_dir} {missing}", fix=f"{GET_THE_CHECKPOINT}; `glm53 demo` serves a tiny model"
        )
    return req.model_dir.resolve()


def resolve_launch(
    req: ServeRequest,
    *,
    plan_here: bool = True,
    need_model: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Launch:
    """Resolve a launch. Bad input raises BadInput before anything starts.

    plan_here: plan a GPU profile without --plan-env on this host (serve, its dry run); False for a
    build-time check, whose host is not this machine. need_model: the checkpoint directory must exist.
    """
    env_file = read_env_file(req.env_file) if req.env_file is not None else None
    overrides = parse_set_options(req.set_values)
    environ = os.environ if environ is None else environ

    def layered(plan_values: list[tuple[str, str, str]]) -> Profile:
        return load_profile(req.profile, environ=environ, env_file=env_file, overrides=overrides, plan=plan_values)

    profile = layered([])
    engine = engine_of(profile.engine)
    if req.rig is not None:  # refused here, not only where planning happens: a skipped plan would ignore it
        if not engine.plans_rigs:
            raise BadInput(
                f"--rig plans {_engines_that('plans_rigs')} profiles; {req.profile} runs on {profile.engine}",
                fix="plan a vLLM profile for another machine with `glm53 plan host --gpu-memory ...`",
            )
        if req.plan_env is not None:
            raise BadInput("--rig and --plan-env both give the plan", fix="pass one of them")
    if req.capture_routing is not None and not engine.captures_routing:
        raise BadInput(
            f"--capture-routing records ExLlamaV3's routing; {req.profile} runs on {profile.engine}",
            fix="serve an exl3-* profile to capture, or drop --capture-routing",
        )
    model_dir = _model_dir(req, need_model=need_model)
    if isinstance(model_dir, Path):
        engine.check_model_dir(model_dir)
    plan_values: list[tuple[str, str, str]] = []
    plan: PlanInput | None = None
    if req.plan_env is not None:
        plan_values, plan = read_plan(req.plan_env, profile.engine)
        status = PlanStatus(
            source="plan-env",
            detail=f"from {req.plan_env}",
            keys=[key for key, _, _ in plan_values] + list(plan.env),
        )
    elif requirements_for(profile).gpus == 0:
        status = PlanStatus(source="not needed", detail=f"{req.profile} runs without GPUs: nothing to plan")
    else:
        status, plan_values, plan = _plan_here(req, profile, plan_here)
    if plan_values:
        profile = layered(plan_values)
    api_key = read_api_key(req.api_key_file) if req.api_key_file is not None else None
    given = LaunchInputs(
        model_dir=model_dir,
        host=req.host,
        port=req.port,
        listen_all=req.listen_all,
        plan=plan,
        api_key=api_key is not None,
        environ=environ,
        plan_here=plan_here,
        capture_routing=req.capture_routing,
    )
    spec = engine.build(profile, given)
    return Launch(spec=spec, profile=profile, plan=status, warnings=_warnings(req, api_key), api_key=api_key)


def _engines_that(capability: str) -> str:
    """The engines with a capability, as a message names them ("exllamav3")."""
    return " and ".join(name for name, engine in SERVE_ENGINES.items() if getattr(engine, capability))


def _warnings(req: ServeRequest, api_key: str | None) -> list[str]:
    warnings = []
    if req.api_key_file is not None and (group_readable := api_key_file_warning(req.api_key_file)):
        warnings.append(group_readable)
    if req.listen_all and not is_loopback(req.host) and api_key is None:
        warnings.append(
            f"--listen-all: {req.host}:{req.port} will answer every machine that reaches it, without an API key; "
            "pass --api-key-file FILE (chmod 600)"
        )
    return warnings


def _plan_here(
    req: ServeRequest, profile: Profile, plan_here: bool
) -> tuple[PlanStatus, list[tuple[str, str, str]], PlanInput | None]:
    planned = engine_of(profile.engine).planned_keys
    if not plan_here:
        status = PlanStatus(source="not planned", detail="planned on the serving host at start", keys=list(planned))
        return status, [], None
    try:
        # A dry run may name a directory that is not there yet (it warns): plan from the published facts then.
        readable = req.model_dir if req.model_dir is not None and missing_directory(req.model_dir) is None else None
        values, plan = plan_on_this_host(profile, readable, root=req.root, rig=req.rig)
    except Unavailable as exc:
        status = PlanStatus(source="impossible", detail=f"cannot plan on this host: {exc.message}", keys=list(planned))
        return status, [], None
    keys = [key for key, _, _ in values] + list(plan.env)
    summary = f": {plan.summary}" if plan.summary else ""
    if req.rig is not None:
        return PlanStatus(source="rig", detail=f"planned for rig {req.rig}{summary}", keys=keys), values, plan
    return PlanStatus(source="this host", detail=f"planned on this host{summary}", keys=keys), values, plan


__all__ = [
    "PLAN_THIS_HOST",
    "Launch",
    "PlanStatus",
    "ProfileCheck",
    "ProfileSummary",
    "ServeRequest",
    "plan_on_this_host",
    "read_plan",
    "resolve_launch",
]
