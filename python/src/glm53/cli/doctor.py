"""`glm53 doctor`: is this host ready to serve a profile? One line per check, each failure with its fix."""

from __future__ import annotations

from pathlib import Path

import typer

from glm53.cli.options import HostOpt, HostRootOpt, JsonOpt, ModelDirOpt, PortOpt, ProfileOpt
from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.errors import CheckFailed, Unavailable
from glm53.output import Output
from glm53.preflight.doctor import (
    ENGINE_LIBRARIES_CHECK,
    DoctorResult,
    load_limits,
    read_facts,
    requirements_for,
    run_checks,
)
from glm53.preflight.render import render_report
from glm53.recipe.profiles import DEFAULT_PROFILE, load_profile


def doctor_cmd(
    profile: ProfileOpt = DEFAULT_PROFILE,
    model_dir: ModelDirOpt = None,
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    host_root: HostRootOpt = Path("/"),
    json_out: JsonOpt = False,
) -> None:
    """Check the engine's libraries, GPUs (NVML), memory, memlock, /dev/shm, THP, CPU, kernel, port, checkpoint.

    Thresholds (driver, compute capabilities, GPU memory) come from repro.lock.json. With --model-dir the
    checkpoint is verified against its lock (stat cache) and its index checked.
    Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 3 when the engine cannot load
    (a shared library it links is missing).

    Examples:
      glm53 doctor
      glm53 doctor --profile cpu-tiny --port 8001
      glm53 doctor --model-dir /models/glm53 --json
    """

    out = Output(json_mode=json_out)
    loaded = load_profile(profile, environ={})
    facts = read_facts(host_root, host=host, port=port, model_dir=model_dir, engine=loaded.engine)
    report = run_checks(facts, requirements_for(loaded), load_limits(loaded.engine), profile=profile)
    result = DoctorResult(**dict(report), facts=facts)
    out.result(result, lambda console: render_report(console, report, f"glm53 doctor — profile {profile}"))
    # vLLM's libraries only: an exllamav3 profile has no such check (its engine's checks fail as checks).
    engine = next((c for c in report.checks if c.name == ENGINE_LIBRARIES_CHECK), None)
    if engine is not None and engine.status == "fail":
        raise Unavailable(engine.detail, fix=engine.fix)
    if not report.ok:
        names = ", ".join(c.name for c in report.failures)
        raise CheckFailed(f"{len(report.failures)} check(s) failed: {names}", fix="see the fix column")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
