"""Profile (+ plan) -> the TabbyAPI launch: its config.yml, the argv that starts it and the environment.

Pure: nothing is read or written here (`glm53.serve.exec` writes the files and execs); a relative TabbyAPI path
is made absolute against the working directory.

TabbyAPI (theroyallab/tabbyAPI, pinned in repro.lock.json `engine.tabbyapi`) is started as
`PYTHON $GLM53_TABBYAPI_DIR/main.py --config RUN_DIR/config.yml` in RUN_DIR, a private directory per port:
TabbyAPI reads its API keys from `api_tokens.yml` in its working directory (common/auth.py), so the key file
goes there (mode 0600) and nowhere else. The config names every field glm53 sets; TabbyAPI fills the rest
from `TABBY_<SECTION>_<FIELD>` environment variables (common/tabby_config.py, `_from_environment`), so those
are removed from the environment: what the dry run shows is all that configures the server.

The config is written as JSON, which is YAML 1.2 (TabbyAPI reads it with ruamel.yaml), so no YAML writer is
needed and quoting cannot go wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.recipe.profiles import BUILTIN_CHAT_TEMPLATE, CONFIG_SPECS, KEYS, Profile, parse_number_list
from glm53.serve.chat_template import bounded_template_path
from glm53.serve.engines.exllamav3.expert_cache import REPORT_NAME as EXPERT_CACHE_REPORT
from glm53.serve.engines.exllamav3.expert_cache import cache_settings
from glm53.serve.engines.exllamav3.routing import CAPTURE_NAME, TRACE_NAME
from glm53.serve.launch import SECRET_ENV, LaunchSpec, PlanInput, check_host, exported_environment

TABBY_DIR_ENV = "GLM53_TABBYAPI_DIR"
TABBY_PYTHON_ENV = "GLM53_TABBYAPI_PYTHON"
CONFIG_NAME = "config.yml"
API_TOKENS_NAME = "api_tokens.yml"  # TabbyAPI's AUTH_FILE, read from the working directory
# Variables that configure TabbyAPI behind the config file's back.
TABBY_ENV_PREFIX = "TABBY_"


class TabbyConfig(BaseModel):
    """TabbyAPI's config.yml as glm53 renders it, and where each field's value came from."""

    model_config = ConfigDict(frozen=True)

    sections: dict[str, dict[str, Any]]
    origins: dict[str, str]  # "model.cache_size" -> "plan (this host)", "exl3-2x3090.env:14", ...

    def text(self) -> str:
        return json.dumps(self.sections, indent=2, allow_nan=False) + "\n"


def run_dir(port: int, environ: Mapping[str, str], uid: int | None = None) -> PurePosixPath:
    """Where TabbyAPI runs: systemd's RuntimeDirectory, else $XDG_RUNTIME_DIR, else a per-user /tmp folder."""
    base = environ.get("RUNTIME_DIRECTORY") or environ.get("XDG_RUNTIME_DIR")
    if base:
        return PurePosixPath(base.split(":")[0]) / f"glm53-tabby-{port}"
    user = os.getuid() if uid is None else uid
    return PurePosixPath("/tmp") / f"glm53-{user}" / f"tabby-{port}"


def _typed(key: str, raw: str) -> Any:
    spec = KEYS[key]
    if spec.number_list:
        numbers = parse_number_list(raw)
        assert numbers is not None  # checked when the profile was loaded
        return numbers
    if spec.kind == "int":
        return int(raw)
    if spec.kind == "float":
        return float(raw)
    if spec.kind == "bool":
        return raw.lower() in ("1", "true", "yes", "on")
    if spec.kind == "json":
        return json.loads(raw)
    if spec.kind == "path" and raw == BUILTIN_CHAT_TEMPLATE:
        return str(bounded_template_path())
    return raw


def render_config(profile: Profile, *, model_dir: Path | str, host: str, port: int, api_key: bool) -> TabbyConfig:
    """The config TabbyAPI loads: network (the address glm53 checked, auth on exactly when there is a key),
    the model (its folder split into TabbyAPI's model_dir + model_name) and every config key of the profile."""
    if profile.engine != "exllamav3":
        raise BadInput(f"profile {profile.name} runs on {profile.engine}, not TabbyAPI")
    path = PurePosixPath(str(model_dir))
    origins: dict[str, str] = {}
    network = {
        "host": host,
        "port": port,
        "disable_auth": not api_key,
        "api_servers": ["oai"],
        "send_tracebacks": False,
    }
    for field in network:
        origins[f"network.{field}"] = "glm53 serve (--host, --port, --api-key-file)"
    model: dict[str, Any] = {
        "model_dir": str(path.parent),
        "model_name": path.name,
        "backend": "exllamav3",
        "inline_model_loading": False,
        "tensor_parallel": False,
    }
    origins["model.model_dir"] = origins["model.model_name"] = "--model-dir"
    origins["model.backend"] = origins["model.tensor_parallel"] = "engine exllamav3 (layer split only)"
    origins["model.inline_model_loading"] = "glm53: serve the one verified checkpoint"
    for spec in CONFIG_SPECS:
        if profile.engine not in spec.engines or not profile.is_set(spec.key):
            continue
        assert spec.config is not None
        section, field = spec.config.split(".", 1)
        if section != "model":
            continue
        model[field] = _typed(spec.key, profile.value(spec.key))
        origins[spec.config] = profile.settings[spec.key].source
    if "gpu_split" in model:
        model["gpu_split_auto"] = False
        origins["model.gpu_split_auto"] = f"GPU_SPLIT ({origins['model.gpu_split']})"
    if "cache_size" in model and "max_seq_len" in model and model["cache_size"] < model["max_seq_len"]:
        raise BadInput(
            f"CACHE_SIZE={model['cache_size']} is below MAX_MODEL_LEN={model['max_seq_len']}",
            fix="TabbyAPI refuses a cache shorter than the context: raise CACHE_SIZE or leave it to the planner",
        )
    if "cache_size" in model and model["cache_size"] % 256:
        raise BadInput(f"CACHE_SIZE={model['cache_size']} is not a multiple of 256", fix="TabbyAPI pages it by 256")
    sections: dict[str, dict[str, Any]] = {
        "network": network,
        "logging": {"log_prompt": False, "log_generation_params": False, "log_requests": False},
        "model": model,
        # MTP drafting is not planned for (its weights and cache are not in the ledger).
        "draft_model": {"draft_mode": "disabled"},
        "developer": {"unsafe_launch": False, "disable_request_streaming": False},
    }
    for section in ("logging", "draft_model", "developer"):
        for field in sections[section]:
            origins[f"{section}.{field}"] = "glm53 (prompts stay out of the logs; no draft model)"
    return TabbyConfig(sections=sections, origins=origins)


def tabby_command(
    environ: Mapping[str, str],
    python: str,
    config_path: PurePosixPath,
    capture_routing: Path | None = None,
    expert_cache: bool = False,
) -> tuple[list[str], str]:
    """The argv that starts TabbyAPI, and where its location came from. Relative paths are made absolute here:
    TabbyAPI starts in its run directory, where they would name nothing. With `capture_routing`, TabbyAPI's
    main.py runs under `glm53.serve.engines.exllamav3.routing`, which records ExLlamaV3's routing into that
    directory; with `expert_cache`, under `glm53.serve.engines.exllamav3.expert_cache`, which runs glm53's GPU
    expert cache in ExLlamaV3 (and the recorder too, with `capture_routing`)."""
    directory = environ.get(TABBY_DIR_ENV)
    program = environ.get(TABBY_PYTHON_ENV) or python
    if "/" in program:
        program = os.path.abspath(program)
    if directory:
        main = os.path.abspath(PurePosixPath(directory) / "main.py")
        origin = f"${TABBY_DIR_ENV}"
    else:
        main = f"${TABBY_DIR_ENV}/main.py"
        origin = f"${TABBY_DIR_ENV} is not set (a start stops until it names TabbyAPI's source tree)"
    if expert_cache:
        report = str(config_path.parent / EXPERT_CACHE_REPORT)
        runner = ["-m", "glm53.serve.engines.exllamav3.expert_cache", "--report", report]
        if capture_routing is not None:
            runner += ["--capture", os.path.abspath(capture_routing)]
        return [program, *runner, main, "--config", str(config_path)], f"{origin}; EXPERT_CACHE=1"
    if capture_routing is not None:
        recorder = ["-m", "glm53.serve.engines.exllamav3.routing", "--out", os.path.abspath(capture_routing)]
        return [program, *recorder, main, "--config", str(config_path)], f"{origin}; --capture-routing"
    return [program, main, "--config", str(config_path)], origin


def tabby_main(argv: list[str]) -> str:
    """TabbyAPI's main.py in a launch argv (`tabby_command`): the word before --config, with or without the
    routing recorder in front of it."""
    if "--config" in argv[1:]:
        return argv[argv.index("--config") - 1]
    return argv[1] if len(argv) > 1 else ""


def _refused_by_tabby(key: str) -> BadInput | None:
    if key in SECRET_ENV or key.startswith(TABBY_ENV_PREFIX):
        return BadInput(f"the plan sets {key}", fix="the plan may set engine variables only")
    return None


def build_tabby_launch(
    profile: Profile,
    *,
    model_dir: Path | str,
    host: str,
    port: int,
    listen_all: bool,
    plan: PlanInput | None,
    api_key: bool,
    environ: Mapping[str, str],
    python: str,
    capture_routing: Path | None = None,
) -> LaunchSpec:
    """The argv, environment, working directory and files for serving `model_dir` with TabbyAPI."""
    if not 0 < port < 65536:
        raise BadInput(f"--port {port} is out of range", fix="use a port between 1 and 65535")
    if capture_routing is not None:
        _check_capture_dir(Path(capture_routing))
    check_host(host, listen_all=listen_all)
    config = render_config(profile, model_dir=model_dir, host=host, port=port, api_key=api_key)
    directory = run_dir(port, environ)
    config_path = directory / CONFIG_NAME
    origins = {f"config {field}": origin for field, origin in config.origins.items()}
    origins["argv"] = ""  # its place among the origins; filled once the environment says which runner starts
    env, affinity = exported_environment(profile, plan, origins, refuse=_refused_by_tabby)
    cache = cache_settings(env)
    if cache is not None:
        _refuse_cpu_experts_with_cache(profile)
    if cache is not None and cache.stats is not None and not cache.stats.is_absolute():
        env["EXPERT_CACHE_STATS"] = os.path.abspath(cache.stats)  # TabbyAPI starts in its run directory
    argv, where = tabby_command(environ, python, config_path, capture_routing, expert_cache=cache is not None)
    origins["argv"] = where
    return LaunchSpec(
        profile=profile.name,
        engine="exllamav3",
        argv=argv,
        env=env,
        origins=origins,
        cpu_affinity=affinity,
        host=host,
        port=port,
        api_key=api_key,
        cwd=str(directory),
        files={CONFIG_NAME: config.text()},
    )


def _refuse_cpu_experts_with_cache(profile: Profile) -> None:
    """The cache serves experts through the GPU kernels' pointer tables: experts on the CPU worker have none."""
    on_cpu = [
        f"{key}={profile.value(key)}"
        for key in ("EXL3_MOE_CPU_SPLIT", "CPU_MOE_OFFLOAD_LAYERS")
        if profile.value(key) not in ("", "0")
    ]
    if on_cpu:
        raise BadInput(
            f"EXPERT_CACHE=1 with {' and '.join(on_cpu)}: the cache serves every routed expert from the GPU's slots, "
            "the CPU worker's experts have no slot",
            fix="set them to 0 (`glm53 plan host --expert-cache` does), or EXPERT_CACHE=0",
        )


def _check_capture_dir(directory: Path) -> None:
    """A capture goes into a directory that is or can be made, and never replaces an earlier capture."""
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"--capture-routing {directory} is not a directory", fix="name a directory for the capture")
    if not directory.exists() and not directory.parent.is_dir():
        raise BadInput(
            f"--capture-routing {directory}: its parent directory does not exist", fix="create it, or name another"
        )
    for name in (CAPTURE_NAME, TRACE_NAME):
        if (directory / name).exists():
            raise BadInput(
                f"--capture-routing {directory} already holds {name}",
                fix="name a new directory (an earlier capture is never replaced)",
            )
    writable = directory if directory.exists() else directory.parent
    if not os.access(writable, os.W_OK | os.X_OK):
        raise BadInput(
            f"--capture-routing {directory}: {writable} is not writable by this user: the capture could not be saved",
            fix="name a directory this user can write",
        )


def clean_environment(inherited: Mapping[str, str]) -> dict[str, str]:
    """The inherited environment without TabbyAPI's own overrides (they would configure it unseen)."""
    return {key: value for key, value in inherited.items() if not key.startswith(TABBY_ENV_PREFIX)}


__all__ = [
    "API_TOKENS_NAME",
    "CONFIG_NAME",
    "TABBY_DIR_ENV",
    "TABBY_PYTHON_ENV",
    "TabbyConfig",
    "build_tabby_launch",
    "clean_environment",
    "render_config",
    "run_dir",
    "tabby_command",
    "tabby_main",
]
