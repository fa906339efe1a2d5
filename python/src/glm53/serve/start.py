"""Start a resolved launch, or show it: the two ends of `glm53 serve`.

    dry_run(request) -> DryRun      the launch a start would run, each value with its origin; starts nothing
    start(request, out) -> NoReturn  engine libraries, preflight (doctor's checks), the engine's own check, then
                                     the engine: as glm53's child, each stage of its start reported with its time
                                     (`glm53.serve.supervise`), or exec'd in place with --exec

Both resolve the launch with `resolve_launch`, the same function and the same inputs, so the dry run's argv,
environment and CPU affinity are what the engine receives.
"""

from __future__ import annotations

import shlex
import time
from typing import NoReturn

from pydantic import BaseModel

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import GET_THE_CHECKPOINT, missing_directory
from glm53.output import Output
from glm53.preflight.doctor import load_limits, read_facts, requirements_for, run_checks
from glm53.serve import engines
from glm53.serve.engines import engine_of
from glm53.serve.launch import FlagCheck, LaunchSpec
from glm53.serve.resolve import PLACEHOLDER_MODEL_DIR, Launch, PlanStatus, ServeRequest, resolve_launch
from glm53.serve.supervise import StartReporter, end_like, supervise, write_all

# Doctor checks whose failure is a wrong flag or file of the request (exit 2); any other failure is the
# host's (exit 3).
INPUT_CHECKS = frozenset({"port", "model directory", "model verified", "model index"})


class DryRun(BaseModel):
    launch: LaunchSpec
    command: str
    flag_check: FlagCheck
    plan: PlanStatus
    warnings: list[str]
    # Every profile key with a value: {"value", "origin", "source"}.
    values: dict[str, dict[str, str]]


def describe(launch: Launch, flag_check: FlagCheck) -> DryRun:
    values = {
        key: {"value": s.value, "origin": s.origin, "source": s.source} for key, s in launch.profile.settings.items()
    }
    return DryRun(
        launch=launch.spec,
        command=shlex.join(launch.spec.argv),
        flag_check=flag_check,
        plan=launch.plan,
        warnings=launch.warnings,
        values=values,
    )


def dry_run(req: ServeRequest, out: Output) -> DryRun:
    launch = resolve_launch(req, need_model=False)
    for warning in [*model_dir_warnings(req), *launch.warnings]:
        out.warn(warning)
    flags = (
        engine_of(launch.spec.engine).check(launch.spec)
        if not req.skip_flag_check
        else FlagCheck(checked=False, vllm_version=None, reason="--skip-flag-check")
    )
    return describe(launch, flags)


def model_dir_warnings(req: ServeRequest) -> list[str]:
    """What a dry run says about the checkpoint directory: a start needs it, the dry run only shows it."""
    if req.model_dir is None:
        return [
            f"no --model-dir: the command shows the placeholder {PLACEHOLDER_MODEL_DIR} (where the image mounts "
            "the checkpoint); a start needs --model-dir DIR"
        ]
    missing = missing_directory(req.model_dir)
    if missing is None:
        return []
    return [f"--model-dir {req.model_dir} {missing}: a start would stop here (exit 2); {GET_THE_CHECKPOINT}"]


def preflight(req: ServeRequest, launch: Launch, out: Output) -> None:
    """Doctor's checks for this profile; on failure nothing starts (exit 2 for the request's own port or
    checkpoint, exit 3 for the host)."""
    spec = launch.spec
    report = run_checks(
        read_facts(req.root, host=spec.host, port=spec.port, model_dir=req.model_dir, engine=spec.engine),
        requirements_for(launch.profile),
        load_limits(launch.profile.engine),
        profile=req.profile,
    )
    for check in report.checks:
        if check.status == "warn":
            out.warn(f"{check.name}: {check.detail}" + (f" (fix: {check.fix})" if check.fix else ""))
    if report.ok:
        return
    lines = [f"{c.name}: {c.detail}" for c in report.failures]
    fixes = [f"{c.name}: {c.fix}" for c in report.failures if c.fix]
    message = "preflight failed, nothing started:\n  " + "\n  ".join(lines)
    fix = "\n  ".join(fixes) or "run `glm53 doctor` for the whole report"
    if all(c.name in INPUT_CHECKS for c in report.failures):
        raise BadInput(message, fix=fix)
    raise Unavailable(message, fix=fix)


def start(req: ServeRequest, out: Output) -> NoReturn:
    if req.rig is not None:
        raise BadInput(
            f"--rig {req.rig} plans another machine; a start serves this one",
            fix="add --dry-run to see that machine's launch, or leave --rig out to plan this host",
        )
    reporter = StartReporter(time.monotonic(), write_all(2))
    # Planning impossible is reported after preflight, so that one run names every problem of the host.
    launch = resolve_launch(req)
    engine = engine_of(launch.spec.engine)
    engine.before_preflight(launch.spec)
    for warning in launch.warnings:
        out.warn(warning)
    if not req.skip_preflight:
        preflight(req, launch, out)
    if launch.plan.source == "impossible":
        raise Unavailable(
            f"{req.profile} needs a plan of this host's expert pools, and {launch.plan.detail}",
            fix="serve on the GPU host, or pass --plan-env from `glm53 plan host --env`",
        )
    if launch.plan.source == "this host":
        out.info(f"planned the expert pools for this host: {len(launch.plan.keys)} values")
    spec = launch.spec
    if not req.exec_in_place:
        checked = "skipped" if req.skip_preflight else "passed"
        reporter.stage("plan", f"launch resolved (plan: {launch.plan.source}), preflight {checked}")
    engine.before_exec(spec, out, skip_flag_check=req.skip_flag_check)
    out.info(f"serving {spec.profile} on {spec.base_url} (OpenAI API under {spec.base_url}/v1)")
    if req.exec_in_place:
        engines.exec_launch(spec, api_key=launch.api_key)
    process = engines.prepare_launch(spec, api_key=launch.api_key)
    reporter.stage("config", "checked by the engine's own parser" if not req.skip_flag_check else "written")
    end_like(supervise(process, engine.start_stages, f"{spec.base_url}/health", reporter))


__all__ = ["INPUT_CHECKS", "DryRun", "describe", "dry_run", "preflight", "start"]
