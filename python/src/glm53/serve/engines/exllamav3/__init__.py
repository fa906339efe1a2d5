"""The second engine, ExLlamaV3 + TabbyAPI: the split planner's values, TabbyAPI's config written 0600 into a
private working directory and checked against TabbyAPI's own schema, its Python started as glm53's child (its
stages reported) or exec'd in place (`--exec`)."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from glm53.checkpoint.model_spec import load_model_spec, read_checkpoint_config
from glm53.constants import GIB
from glm53.errors import BadInput, Unavailable
from glm53.fsutil import GET_THE_CHECKPOINT, atomic_write_bytes
from glm53.host.rig import load_rig
from glm53.output import Output
from glm53.plan.exllamav3.split import Exl3Plan, plan_exl3_for_host
from glm53.plan.vllm.env import PLANNED_KEYS_EXL3
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile
from glm53.serve.engines.base import PLAN_THIS_HOST, LaunchInputs, PlanLayer
from glm53.serve.engines.exllamav3.tabby import API_TOKENS_NAME, build_tabby_launch, clean_environment, tabby_main
from glm53.serve.engines.exllamav3.tabby_check import require_tabby_config, tabby_config_check
from glm53.serve.exec import EngineProcess, find_program
from glm53.serve.launch import FlagCheck, LaunchSpec, PlanInput, environment_for_exec
from glm53.serve.progress import StageMarker


def exl3_summary(plan: object) -> str:
    """One line of an Exl3Plan: where the layers and experts go, and the predicted decode rate."""
    assert isinstance(plan, Exl3Plan)
    if plan.expert_cache is not None:
        size = plan.expert_cache
        cache = (
            f"expert cache: {size.slots} resident slots a MoE layer ({size.pinned} pinned + {size.window} LRU) "
            f"and {size.staging} staging, {size.used_bytes_per_gpu / GIB:.1f} GiB a GPU; host pool "
            f"{size.host_pool_bytes / GIB:.1f} GiB"
        )
        return "; ".join([cache, *(f"warning: {warning}" for warning in plan.warnings)])
    gpus = "; ".join(
        f"GPU {g.index}: layers {g.layers[0]}-{g.layers[-1]}, {g.resident_experts} experts"
        if g.layers
        else f"GPU {g.index}: no layer"
        for g in plan.gpus
    )
    return (
        f"{plan.offload.reason}; {gpus}; host RAM {plan.host.cpu_expert_bytes / GIB:.1f} GiB of experts "
        f"of a {plan.host.budget_bytes / GIB:.0f} GiB budget; predicted {plan.prediction.tokens_per_s:g} tok/s "
        f"({plan.prediction.mode}, {plan.prediction.cpu_share:.0%} of selections on the CPU)"
    )


EXL3_SPEC = "glm53-flash-exl3"


def check_exl3_checkpoint(model_dir: Path) -> None:
    """An exl3 profile serves GLM-5.3-Flash in EXL3: a checkpoint of another family (its config.json's
    model_type and quantization) would load into the wrong architecture, or fail late inside the engine."""
    spec = load_model_spec(EXL3_SPEC)
    config = read_checkpoint_config(model_dir)
    if config is None:
        raise BadInput(
            f"--model-dir {model_dir} has no config.json", fix=f"{GET_THE_CHECKPOINT}; it must be the whole directory"
        )
    if not spec.match.fits(config):
        raise BadInput(
            f"--model-dir {model_dir}: config.json describes model_type {config.model_type!r} quantized by "
            f"{config.quant_method!r}; the exl3 profiles serve {spec.description} (model_type "
            f"{spec.match.model_type!r}, {spec.match.quant_method!r})",
            fix=f"{GET_THE_CHECKPOINT}, or serve this model with a profile of its own engine",
        )


def prepare_run_dir(spec: LaunchSpec, api_key: str | None) -> None:
    """The engine's private working directory (TabbyAPI): created 0700 if absent, refused if it is a link or
    another user's; its files written atomically 0600, the API key file too (and removed when there is none,
    so that a key from an earlier start cannot linger)."""
    assert spec.cwd is not None
    directory = Path(spec.cwd)
    try:
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        raise Unavailable(
            f"cannot create {directory}: {exc.strerror}", fix="set XDG_RUNTIME_DIR to a private folder"
        ) from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise Unavailable(
            f"{directory} is not a directory of this user", fix="remove it, or set XDG_RUNTIME_DIR elsewhere"
        )
    # Whoever owns the folder above can rename this one and put theirs in its place (/tmp/glm53-UID made first
    # by another user): it must be this user's or root's, and so must a link to it.
    parent = directory.parent
    if any(entry.st_uid not in (os.getuid(), 0) for entry in (parent.lstat(), parent.stat())):
        raise Unavailable(
            f"{parent} belongs to another user", fix="remove it, or set XDG_RUNTIME_DIR to a private folder"
        )
    os.chmod(directory, 0o700)
    for name, text in spec.files.items():
        atomic_write_bytes(directory / name, text.encode(), mode=0o600)
    tokens = directory / API_TOKENS_NAME
    if api_key is not None:
        # TabbyAPI's admin key may load and unload models: a random one nobody is told.
        content = json.dumps({"api_key": api_key, "admin_key": secrets.token_hex(32)}) + "\n"
        atomic_write_bytes(tokens, content.encode(), mode=0o600)
    else:
        tokens.unlink(missing_ok=True)


# The stages of a start in TabbyAPI's log (e632af41: backends/exllamav3/model.py, endpoints/server.py via uvicorn)
# and ExLlamaV3 1.4.6's (modules/block_sparse_mlp_cpu.py), in the order a start reaches them.
EXL3_START_STAGES = (
    StageMarker(
        "imports",
        re.compile(r"Loading model: "),
        "TabbyAPI, torch, ExLlamaV3 and its prebuilt extension imported; loading the model",
    ),
    StageMarker(
        "CPU worker",
        re.compile(r" -- CPU(-offloaded| split) experts \(worker"),
        "ExLlamaV3's CPU expert worker took its first MoE layer",
    ),
    StageMarker("engine load", re.compile(r"Model successfully loaded"), "every layer loaded"),
    StageMarker("API server", re.compile(r"Uvicorn running on|Application startup complete"), "TabbyAPI listening"),
)


class Exllamav3Engine:
    name: Engine = "exllamav3"
    planned_keys: tuple[str, ...] = PLANNED_KEYS_EXL3
    plans_rigs = True
    captures_routing = True
    plan_shape_fields: tuple[str, ...] | None = ("max_model_len", "max_num_seqs", "pool_threads")
    start_stages: tuple[StageMarker, ...] = EXL3_START_STAGES

    def check_model_dir(self, model_dir: Path) -> None:
        if model_dir.is_dir():
            check_exl3_checkpoint(model_dir)

    def plan_here(self, profile: Profile, model_dir: Path | None, *, root: Path, rig: str | None) -> PlanLayer:
        exl3 = plan_exl3_for_host(
            profile, model_dir=model_dir, root=root, rig=load_rig(rig) if rig is not None else None
        )
        where = f"plan (rig {rig})" if rig is not None else PLAN_THIS_HOST
        values = [(key, value, f"{where}: {exl3.origins[key]}") for key, value in exl3.env.items()]
        cpus = sorted(set(exl3.main_cpus) | set(exl3.cpu_pool))
        return values, PlanInput(env={}, cpu_affinity=cpus or None, summary=exl3_summary(exl3))

    def build(self, profile: Profile, given: LaunchInputs) -> LaunchSpec:
        return build_tabby_launch(
            profile,
            model_dir=given.model_dir,
            host=given.host,
            port=given.port,
            listen_all=given.listen_all,
            plan=given.plan,
            api_key=given.api_key,
            environ=given.environ,
            python=sys.executable,
            capture_routing=given.capture_routing,
        )

    def check(self, spec: LaunchSpec) -> FlagCheck:
        return tabby_config_check(spec)

    def check_line(self, check: FlagCheck) -> str:
        if check.checked:
            return f"config: accepted by {check.vllm_version}'s schema"
        return f"config: not checked ({check.reason})"

    def api_key_lines(self, spec: LaunchSpec) -> tuple[str | None, str | None]:
        return None, (f"{spec.cwd}/{API_TOKENS_NAME}" if spec.api_key else None)

    def before_preflight(self, spec: LaunchSpec) -> None:
        return None  # the doctor's exllamav3 check reads the engine's own libraries

    def before_exec(self, spec: LaunchSpec, out: Output, *, skip_flag_check: bool) -> None:
        out.info(require_tabby_config(spec))

    def prepare(self, spec: LaunchSpec, *, api_key: str | None, inherited: Mapping[str, str]) -> EngineProcess:
        env = environment_for_exec(spec, clean_environment(inherited), None)
        # a bare GLM53_TABBYAPI_PYTHON (python3) is looked up on the launch's PATH
        program = find_program(spec.argv[0], env, fix="set GLM53_TABBYAPI_PYTHON to TabbyAPI's Python")
        main = tabby_main(spec.argv)
        if not Path(main).is_file():
            raise Unavailable(
                f"{main} not found", fix="set GLM53_TABBYAPI_DIR to TabbyAPI's source tree (docs/serve.md)"
            )
        prepare_run_dir(spec, api_key)
        return EngineProcess(
            program=program, argv=spec.argv, env=env, cwd=spec.cwd or "/", cpu_affinity=spec.cpu_affinity
        )


EXLLAMAV3 = Exllamav3Engine()
