"""Profile (+ plan) -> LaunchSpec: the exact vLLM argv, the environment to export and the CPU affinity.

Pure: no file is read, nothing is started. `glm53.serve.exec` carries a LaunchSpec out.

The flags, their order and how each key becomes one are declared on the key specs (`glm53.recipe.profiles`);
the order follows the recipe's `config.launch`, so `agent-256k` reproduces it element for element
except for the model path, the host (127.0.0.1 unless the caller asks for another address), the chat
template's path (the packaged copy) and the flag names the pinned vLLM spells differently
(`--kv-cache-memory` is `--kv-cache-memory-bytes` in vLLM 0.32).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.errors import BadInput
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import BUILTIN_CHAT_TEMPLATE, FLAG_SPECS, KEYS, Profile
from glm53.serve.chat_template import bounded_template_path

# Variables that never come from a profile: the API key travels through VLLM_API_KEY only.
SECRET_ENV = ("VLLM_API_KEY",)


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


def compilation_config(profile: Profile) -> str | None:
    config: dict[str, object] = {}
    if profile.is_set("COMPILATION_MODE"):
        config["mode"] = int(profile.value("COMPILATION_MODE"))
    if profile.is_set("CUDA_GRAPH_MODE"):
        config["cudagraph_mode"] = profile.value("CUDA_GRAPH_MODE")
    return json.dumps(config, separators=(",", ":")) if config else None


def resolve_chat_template(value: str) -> str:
    return str(bounded_template_path()) if value == BUILTIN_CHAT_TEMPLATE else value


def build_launch(
    profile: Profile,
    *,
    model_dir: Path | str,
    vllm_command: Sequence[str] = ("vllm", "serve"),
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    listen_all: bool = False,
    plan: PlanInput | None = None,
    api_key: bool = False,
    extra_args: Sequence[str] = (),
) -> LaunchSpec:
    """The argv, environment and CPU affinity for serving `model_dir` with `profile`."""
    if not 0 < port < 65536:
        raise BadInput(f"--port {port} is out of range", fix="use a port between 1 and 65535")
    check_host(host, listen_all=listen_all)
    argv: list[str] = [*vllm_command, str(model_dir)]
    origins: dict[str, str] = {}
    for spec in FLAG_SPECS:
        flag = spec.flag
        assert flag is not None  # every flag key names its flag
        if spec.style == "compilation":
            value = compilation_config(profile)
            if value is not None and flag not in origins:
                argv += [flag, value]
                origins[flag] = ", ".join(
                    profile.settings[s.key].source
                    for s in FLAG_SPECS
                    if s.style == "compilation" and profile.is_set(s.key)
                )
        elif spec.style == "bool":
            state = profile.flag_bool(spec.key)
            if state is not None:
                argv.append(flag if state else "--no-" + flag.removeprefix("--"))
                origins[flag] = profile.settings[spec.key].source
        elif profile.is_set(spec.key):
            value = profile.value(spec.key)
            argv += [flag, resolve_chat_template(value) if spec.style == "template" else value]
            origins[flag] = profile.settings[spec.key].source
        if spec.key == "SERVED_MODEL_NAME":  # the recipe puts the address right after the model's name
            argv += ["--host", host, "--port", str(port)]
    argv += list(extra_args)

    env, affinity = exported_environment(profile, plan, origins, refuse=_refused_by_vllm)
    return LaunchSpec(
        profile=profile.name,
        argv=argv,
        env=env,
        origins=origins,
        cpu_affinity=affinity,
        host=host,
        port=port,
        api_key=api_key,
    )


def _refused_by_vllm(key: str) -> BadInput | None:
    if key in SECRET_ENV:
        return BadInput(f"the plan sets {key}", fix="the API key comes from --api-key-file only")
    if key in KEYS and KEYS[key].role == "flag":
        return BadInput(
            f"the plan sets {key}, which is a launch flag, not an environment variable",
            fix="set it with --set instead",
        )
    return None


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
