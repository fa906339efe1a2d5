"""What every engine's launch is: a LaunchSpec (argv, environment to export, CPU affinity, files), the plan
input it is built with, and the environment an exec receives. Each engine builds its own (`glm53.serve.engines`).

Pure: no file is read, nothing is started.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from glm53.constants import DEFAULT_HOST
from glm53.errors import BadInput
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile

# Variables that never come from a profile: the API key travels through VLLM_API_KEY only.
SECRET_ENV = ("VLLM_API_KEY",)


class FlagCheck(BaseModel):
    """An engine's own check of a launch (vLLM's serve parser, TabbyAPI's config schema)."""

    model_config = ConfigDict(frozen=True)

    checked: bool
    vllm_version: str | None
    cached: bool = False
    reason: str | None = None  # why nothing was checked


class PlanInput(BaseModel):
    """What the host planner contributes: extra environment (KEY=VALUE lines) and the serving CPUs."""

    model_config = ConfigDict(frozen=True)

    env: dict[str, str] = Field(default_factory=dict)
    cpu_affinity: list[int] | None = None
    # The plan in one line (what goes where, the predicted rate), for the dry run and the start's log.
    summary: str = ""


class LaunchSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    profile: str
    argv: list[str]
    # Exported on top of the inherited environment, in this order (profile keys, then the plan's).
    env: dict[str, str]
    # Where each exported variable and each flag value came from ("agent-256k.env:12", "plan", "--set", ...).
    origins: dict[str, str]
    cpu_affinity: list[int] | None
    host: str
    port: int
    # True when an API key will be passed in VLLM_API_KEY (never shown, never in argv).
    api_key: bool = False
    # The engine started; exllamav3 (TabbyAPI) runs in `cwd` and reads `files` written there first
    # (name -> content; the API key file is written at start and never shown).
    engine: Engine = "vllm"
    cwd: str | None = None
    files: dict[str, str] = Field(default_factory=dict)

    @property
    def base_url(self) -> str:
        host = DEFAULT_HOST if self.host in ("0.0.0.0", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, and ::ffff:127.x.y.z (the IPv4 loopback spelled as IPv6)."""
    address = _address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback


def check_host(host: str, *, listen_all: bool) -> str:
    """127.0.0.1 by default; an address other than loopback needs the explicit `--listen-all` flag."""
    if _address(host) is None:
        raise BadInput(f"--host {host!r} is not an IP address", fix="use 127.0.0.1, or 0.0.0.0 with --listen-all")
    if not is_loopback(host) and not listen_all:
        raise BadInput(
            f"--host {host} would accept connections from other machines",
            fix="pass --listen-all as well if that is what you want (and set --api-key-file)",
        )
    return host


def exported_environment(
    profile: Profile,
    plan: PlanInput | None,
    origins: dict[str, str],
    *,
    refuse: Callable[[str], BadInput | None],
) -> tuple[dict[str, str], list[int] | None]:
    """The engine's environment (the profile's exports, then the plan's variables, each origin recorded in
    `origins`) and the CPU affinity. `refuse` names a plan variable the engine must not get from a plan."""
    env: dict[str, str] = {}
    for key, value in profile.env_exports().items():
        env[key] = value
        origins[key] = profile.settings[key].source
    if plan is not None:
        for key, value in plan.env.items():
            if (error := refuse(key)) is not None:
                raise error
            env[key] = value
            origins[key] = "plan"
    affinity = sorted(set(plan.cpu_affinity)) if plan is not None and plan.cpu_affinity else None
    return env, affinity


def environment_for_exec(spec: LaunchSpec, inherited: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """The full environment vLLM gets: inherited, then the spec's exports, then the key (or no key at all)."""
    env = {k: v for k, v in inherited.items() if k not in SECRET_ENV}
    env.update(spec.env)
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key
    return env
