"""Start a router from a fleet file, or show what a start would exec: the two ends of `glm53 router`.

    dry_run(request) -> RouterDryRun   the argv and environment a start would exec; reads the fleet, starts nothing
    start(request, out) -> NoReturn     the flag check, a probe of every backend, then exec

Both build the launch with `build_router_launch` from the same fleet, so the dry run's argv is what exec gets.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import httpx
from pydantic import BaseModel

from glm53.errors import BadInput, Unavailable
from glm53.output import Output
from glm53.router.flags import RouterFlagCheck, check_router_flags
from glm53.router.fleet import Fleet, load_fleet
from glm53.router.launch import RouterLaunch, build_router_launch, router_command, router_environment
from glm53.serve.exec import api_key_file_warning, read_api_key

if TYPE_CHECKING:
    import httpx

# The probe of a backend before the start is bounded in time and bytes (docs/router.md): a backend that
# trickles its answer a byte at a time is given up on after PROBE_DEADLINE_S in all, one whose body never ends
# after PROBE_MAX_BYTES; neither can hold the start or fill memory.
PROBE_TIMEOUT_S = 3.0  # connect, and each wait for the next bytes
PROBE_DEADLINE_S = 10.0  # one request, first byte to last
PROBE_MAX_BYTES = 64 * 1024


class RouterRequest(BaseModel):
    fleet_file: Path
    listen_all: bool = False
    # Over the fleet file's api_key_file (a systemd credential's path is only known at start).
    api_key_file: Path | None = None
    skip_flag_check: bool = False
    skip_probe: bool = False


class RouterDryRun(BaseModel):
    launch: RouterLaunch
    command: str
    flag_check: RouterFlagCheck
    fleet: Fleet
    warnings: list[str]


class Resolved(BaseModel):
    fleet: Fleet
    launch: RouterLaunch
    warnings: list[str]
    api_key: str | None = None


def resolve(req: RouterRequest) -> Resolved:
    fleet = load_fleet(req.fleet_file)
    if req.api_key_file is not None:
        fleet = fleet.model_copy(update={"api_key_file": req.api_key_file})
    api_key = read_api_key(fleet.api_key_file) if fleet.api_key_file is not None else None
    launch = build_router_launch(fleet, listen_all=req.listen_all, api_key=api_key is not None)
    warnings = []
    if fleet.api_key_file is not None and (group := api_key_file_warning(fleet.api_key_file)):
        warnings.append(group)
    if fleet.policy not in ("consistent_hash", "sticky_least_loaded"):
        warnings.append(f"policy {fleet.policy} does not keep a session on its backend: agent turns lose their cache")
    return Resolved(fleet=fleet, launch=launch, warnings=warnings, api_key=api_key)


def _flag_check(req: RouterRequest, launch: RouterLaunch) -> RouterFlagCheck:
    if req.skip_flag_check:
        return RouterFlagCheck(checked=False, router_version=None, reason="--skip-flag-check")
    return check_router_flags(launch.argv, router_command())


def _require_checked(req: RouterRequest, check: RouterFlagCheck) -> None:
    """A launch whose flags could not be checked is not accepted: the router it names is not installed here
    (the NixOS module's build-time check, a dry run before a start). --skip-flag-check says so on purpose."""
    if not check.checked and not req.skip_flag_check:
        raise Unavailable(
            f"the router's flags cannot be checked: {check.reason}",
            fix="install vllm-router in glm53's Python (pip install vllm-router==0.1.17; on NixOS the "
            "glm53-router package), or pass --skip-flag-check",
        )


def dry_run(req: RouterRequest, out: Output) -> RouterDryRun:
    resolved = resolve(req)
    for warning in resolved.warnings:
        out.warn(warning)
    check = _flag_check(req, resolved.launch)
    _require_checked(req, check)
    return RouterDryRun(
        launch=resolved.launch,
        command=shlex.join(resolved.launch.argv),
        flag_check=check,
        fleet=resolved.fleet,
        warnings=resolved.warnings,
    )


class _ProbeFailed(Exception):
    pass


def _bounded_get(client: httpx.Client, url: str, headers: dict[str, str] | None = None) -> int:
    """GET `url` and read its body, within PROBE_DEADLINE_S and PROBE_MAX_BYTES; the status code."""
    deadline = time.monotonic() + PROBE_DEADLINE_S
    with client.stream("GET", url, headers=headers) as response:
        received = 0
        for chunk in response.iter_raw():  # as the bytes arrive: a chunk size would wait to fill it
            received += len(chunk)
            if received > PROBE_MAX_BYTES:
                raise _ProbeFailed(f"{url} answered more than {PROBE_MAX_BYTES:,} bytes")
            if time.monotonic() > deadline:
                raise _ProbeFailed(f"{url} took more than {PROBE_DEADLINE_S:g} s to answer")
        return response.status_code


def _probe_one(url: str, endpoint: str, api_key: str | None) -> str | None:
    """None if the backend answers as a glm53 server should; else what is wrong."""
    try:
        with httpx.Client(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            status = _bounded_get(client, url + endpoint)
            if status != 200:
                return f"{url}{endpoint} answered {status}"
            if api_key is not None:
                bare = _bounded_get(client, url + "/v1/models")
                if bare != 401:
                    return f"{url} answers /v1/models without the API key ({bare}): serve it with --api-key-file"
                keyed = _bounded_get(client, url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
                if keyed != 200:
                    return f"{url} refuses the fleet's API key ({keyed})"
    except _ProbeFailed as exc:
        return str(exc)
    except httpx.HTTPError as exc:
        return f"{url} is unreachable: {type(exc).__name__}: {exc}"
    return None


def probe_backends(fleet: Fleet, api_key: str | None) -> None:
    """Every backend answers /health (and, with a key, refuses requests without it). BadInput lists the others."""
    urls = [backend.url for backend in fleet.backends]
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        problems = [p for p in pool.map(lambda u: _probe_one(u, fleet.health.endpoint, api_key), urls) if p]
    if problems:
        raise BadInput(
            f"{len(problems)} of {len(urls)} backends are not ready:\n  " + "\n  ".join(problems),
            fix="start them (glm53 serve), fix the URLs in the fleet file, or pass --skip-probe to start anyway",
        )


def start(req: RouterRequest, out: Output) -> NoReturn:
    resolved = resolve(req)
    for warning in resolved.warnings:
        out.warn(warning)
    launch = resolved.launch
    check = _flag_check(req, launch)
    _require_checked(req, check)
    if check.checked:
        out.info(
            f"flags accepted by vllm-router {check.router_version}'s parser" + (" (cached)" if check.cached else "")
        )
    if not req.skip_probe:
        probe_backends(resolved.fleet, resolved.api_key)
    env = router_environment(launch, os.environ, resolved.api_key)
    program = launch.argv[0]
    if os.sep not in program and shutil.which(program, path=env.get("PATH")) is None:
        raise Unavailable(f"{program} not found on PATH")
    out.info(f"routing {launch.base_url} -> {', '.join(launch.backends)} ({launch.policy})")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(program, launch.argv, env)


__all__ = ["RouterDryRun", "RouterRequest", "dry_run", "probe_backends", "resolve", "start"]
