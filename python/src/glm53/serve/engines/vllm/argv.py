"""Profile (+ plan) -> LaunchSpec for vLLM: the exact `vllm serve` argv, the environment to export and the CPU
affinity. Pure: no file is read, nothing is started.

The flags, their order and how each key becomes one are declared on the key specs (`glm53.recipe.profiles`);
the order follows the recipe's `config.launch`, so `agent-256k` reproduces it element for element
except for the model path, the host (127.0.0.1 unless the caller asks for another address), the chat
template's path (the packaged copy) and the flag names the pinned vLLM spells differently
(`--kv-cache-memory` is `--kv-cache-memory-bytes` in vLLM 0.32).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.errors import BadInput
from glm53.recipe.profiles import BUILTIN_CHAT_TEMPLATE, FLAG_SPECS, KEYS, Profile
from glm53.serve.chat_template import bounded_template_path
from glm53.serve.launch import SECRET_ENV, LaunchSpec, PlanInput, check_host, exported_environment


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
