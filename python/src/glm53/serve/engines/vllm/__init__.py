"""The recipe's engine, vLLM: the pool planner's values, `vllm serve` with every flag checked by vLLM's own serve
parser, started as glm53's child (its stages reported) or exec'd in place (`--exec`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from glm53.errors import BadInput
from glm53.host.native_libs import find_system_library, read_loader_view, require_engine_libraries
from glm53.output import Output
from glm53.plan.vllm.env import PLANNED_KEYS, plan_serving_env
from glm53.preflight.doctor import requirements_for
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import KEYS, Profile
from glm53.serve.engines.base import PLAN_THIS_HOST, LaunchInputs, PlanLayer
from glm53.serve.engines.vllm.argv import build_launch
from glm53.serve.engines.vllm.flags import check_flags, vllm_command
from glm53.serve.exec import EngineProcess, find_program
from glm53.serve.launch import FlagCheck, LaunchSpec, PlanInput, environment_for_exec
from glm53.serve.progress import StageMarker


def _driver_env(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Triton finds libcuda through /sbin/ldconfig, which images and Nix hosts lack: point it at the driver's
    library where this host's loader finds it, unless TRITON_LIBCUDA_PATH is set already."""
    if environ.get("TRITON_LIBCUDA_PATH"):
        return {}
    found = find_system_library("libcuda.so.1", read_loader_view(environ))
    if found is None:
        return {}
    return {"TRITON_LIBCUDA_PATH": (str(found.parent), f"this host ({found})")}


# The stages of a start in vLLM's log (0.32: v1/engine/core.py, model_loader/default_loader.py, the GPU
# runner's "Model loading took", entrypoints' server start), in the order a start reaches them.
VLLM_START_STAGES = (
    StageMarker("engine core", re.compile(r"Initializing a V1 LLM engine"), "vLLM's engine core started"),
    StageMarker("model load", re.compile(r"Loading weights took|Model loading took"), "weights loaded"),
    StageMarker(
        "KV cache and warm-up",
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
        "KV cache allocated, model warmed up",
    ),
    StageMarker(
        "API server",
        re.compile(r"Starting vLLM server on|Uvicorn running on|Application startup complete"),
        "vLLM listening",
    ),
)


class VllmEngine:
    name: Engine = "vllm"
    planned_keys: tuple[str, ...] = PLANNED_KEYS
    plans_rigs = False
    captures_routing = False
    plan_shape_fields: tuple[str, ...] | None = None
    start_stages: tuple[StageMarker, ...] = VLLM_START_STAGES

    def check_model_dir(self, model_dir: Path) -> None:
        return None  # vLLM reads the checkpoint's own config; `glm53 model verify` checks the files

    def plan_here(self, profile: Profile, model_dir: Path | None, *, root: Path, rig: str | None) -> PlanLayer:
        if rig is not None:
            raise BadInput(
                f"--rig plans exllamav3 profiles; {profile.name} runs on vllm",
                fix="plan a vLLM profile for another machine with `glm53 plan host --gpu-memory ...`",
            )
        env, affinity = plan_serving_env(profile, model_dir=model_dir, root=root)
        values = [(key, value, PLAN_THIS_HOST) for key, value in env.items() if key in KEYS]
        others = {key: value for key, value in env.items() if key not in KEYS}
        return values, PlanInput(env=others, cpu_affinity=list(affinity) or None)

    def build(self, profile: Profile, given: LaunchInputs) -> LaunchSpec:
        spec = build_launch(
            profile,
            model_dir=given.model_dir,
            vllm_command=vllm_command(),
            host=given.host,
            port=given.port,
            listen_all=given.listen_all,
            plan=given.plan,
            api_key=given.api_key,
        )
        host_env = _driver_env(given.environ) if given.plan_here and requirements_for(profile).gpus > 0 else {}
        if not host_env:
            return spec
        return spec.model_copy(
            update={
                "env": {**spec.env, **{key: value for key, (value, _) in host_env.items()}},
                "origins": {**spec.origins, **{key: origin for key, (_, origin) in host_env.items()}},
            }
        )

    def check(self, spec: LaunchSpec) -> FlagCheck:
        return check_flags(spec.argv)

    def check_line(self, check: FlagCheck) -> str:
        if check.checked:
            return f"flags: accepted by {check.vllm_version}'s serve parser" + (" (cached)" if check.cached else "")
        return f"flags: not checked ({check.reason})"

    def api_key_lines(self, spec: LaunchSpec) -> tuple[str | None, str | None]:
        return ("VLLM_API_KEY=<from --api-key-file, not shown>" if spec.api_key else None), None

    def before_preflight(self, spec: LaunchSpec) -> None:
        require_engine_libraries()

    def before_exec(self, spec: LaunchSpec, out: Output, *, skip_flag_check: bool) -> None:
        if skip_flag_check:
            return
        check = check_flags(spec.argv)
        if check.checked:
            cached = " (cached)" if check.cached else ""
            out.info(f"flags accepted by {check.vllm_version}'s serve parser{cached}")
        else:
            out.warn(f"flags not checked: {check.reason}")

    def prepare(self, spec: LaunchSpec, *, api_key: str | None, inherited: Mapping[str, str]) -> EngineProcess:
        env = environment_for_exec(spec, inherited, api_key)
        program = find_program(
            spec.argv[0], env, fix="install vLLM (make setup installs the CPU build) or run the recipe's image"
        )
        return EngineProcess(program=program, argv=spec.argv, env=env, cwd=None, cpu_affinity=spec.cpu_affinity)


VLLM = VllmEngine()
