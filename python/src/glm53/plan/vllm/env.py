"""The plan as the environment the serving entrypoint exports (KEY=VALUE lines), and the rankings file.

Formats (docs/plan.md has the full text):
    CPU_OFFLOAD_GB          integer GiB per GPU of routed-expert weights kept in host memory (vLLM's flag)
    KV_CACHE_MEMORY_BYTES   integer bytes of KV cache per GPU
    EXL3_LRU_CAPACITY_PLAN  comma-separated LAYER:SLOTS:PINNED, one per MoE layer, e.g. 3:74:18,4:80:22,...
                            (GPU expert slots of the layer, the first PINNED of them hold its hottest experts)
    EXL3_PINNED_FRAC        the pinned share of all slots, 4 decimals (for engines reading one fraction)
    EXL3_VMM_HOT_RANKINGS   path of {"<layer>": [expert ids, hottest first]} (only with routing statistics)
    HYBRID_MAIN_CPUS        CPU list of the serving process (kernel list format, 0-33,40-41)
    EXL3_HYBRID_CPU         CPU expert-pool threads, one CPU list per tensor-parallel rank, ';' between ranks
    EXL3_HYBRID_LAYERS      MoE layers that may run missed experts on the CPU pool (list format, 3-44)
    OMP_NUM_THREADS         pool threads per rank
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from glm53.errors import BadInput
from glm53.fsutil import atomic_write_json, atomic_write_text
from glm53.host.topology import format_cpu_list
from glm53.plan.files import env_lines, make_out_dir
from glm53.plan.finite import require_finite
from glm53.plan.inputs.gpus import GpuSpec
from glm53.plan.vllm.planner import Plan, plan_for_host, shape_from_profile

RANKINGS_FILENAME = "hot-rankings.json"
# Every key `plan_env` can set, in its order: what a dry run names when this host cannot be planned.
PLANNED_KEYS = (
    "CPU_OFFLOAD_GB",
    "KV_CACHE_MEMORY_BYTES",
    "EXL3_LRU_CAPACITY_PLAN",
    "EXL3_PINNED_FRAC",
    "EXL3_VMM_HOT_RANKINGS",
    "HYBRID_MAIN_CPUS",
    "EXL3_HYBRID_CPU",
    "EXL3_HYBRID_LAYERS",
    "OMP_NUM_THREADS",
)


# What the ExLlamaV3 planner fills (glm53.plan.exllamav3.split).
PLANNED_KEYS_EXL3 = (
    "GPU_SPLIT",
    "CACHE_SIZE",
    "EXL3_MOE_CPU_SPLIT",
    "EXL3_MOE_CPU_SPLIT_LAYERS",
    "CPU_MOE_OFFLOAD_LAYERS",
    "EXL3_MOE_CPU_THREADS",
)


def capacity_plan_text(plan: Plan) -> str:
    return ",".join(f"{layer.layer}:{layer.slots}:{layer.pinned}" for layer in plan.cache.layers)


def parse_capacity_plan(text: str) -> dict[int, tuple[int, int]]:
    """EXL3_LRU_CAPACITY_PLAN back into {layer: (slots, pinned)}; LAYER:SLOTS means nothing pinned."""
    out: dict[int, tuple[int, int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split(":")
        if len(fields) not in (2, 3) or not all(f.isdigit() for f in fields):
            raise BadInput(f"EXL3_LRU_CAPACITY_PLAN: {item!r} is not LAYER:SLOTS or LAYER:SLOTS:PINNED")
        layer, slots = int(fields[0]), int(fields[1])
        pinned = int(fields[2]) if len(fields) == 3 else 0
        if pinned > slots:
            raise BadInput(f"EXL3_LRU_CAPACITY_PLAN: layer {layer} pins {pinned} of only {slots} slots")
        if layer in out:
            raise BadInput(f"EXL3_LRU_CAPACITY_PLAN: layer {layer} appears twice")
        out[layer] = (slots, pinned)
    return out


def plan_env(plan: Plan, rankings_path: Path | None = None) -> dict[str, str]:
    """The KEY -> value mapping the entrypoint exports, in a stable order."""
    env = {
        "CPU_OFFLOAD_GB": str(plan.host.cpu_offload_gb),
        "KV_CACHE_MEMORY_BYTES": str(plan.kv.kv_cache_memory_bytes),
        "EXL3_LRU_CAPACITY_PLAN": capacity_plan_text(plan),
        "EXL3_PINNED_FRAC": f"{plan.cache.pinned_fraction:.4f}",
    }
    if rankings_path is not None:
        env["EXL3_VMM_HOT_RANKINGS"] = str(rankings_path)
    env["HYBRID_MAIN_CPUS"] = plan.cpu_sets.main_text
    env["EXL3_HYBRID_CPU"] = plan.cpu_sets.pools_text
    env["EXL3_HYBRID_LAYERS"] = format_cpu_list(plan.moe_layers)
    env["OMP_NUM_THREADS"] = str(plan.cpu_sets.threads_per_rank)
    return env


def write_rankings(plan: Plan, directory: Path, *, what: str = "the rankings directory") -> Path | None:
    """Write the rankings file into `directory`; None when the plan has no rankings (no statistics)."""
    if plan.cache.rankings is None:
        return None
    make_out_dir(directory, what=what)
    path = directory / RANKINGS_FILENAME
    atomic_write_json(path, plan.cache.rankings)
    return path.resolve()


def state_dir() -> Path:
    """Where the rankings go when no --out is given: the entrypoint reads them by path, so they must last."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(base) / "glm53" / "plan"


@dataclass(frozen=True)
class SavedPlan:
    plan: Plan  # its rankings_file set to where the rankings were written
    env: dict[str, str]
    rankings: Path | None
    plan_files: tuple[Path, ...]  # plan.json and plan.env, when an out directory was given


def save_plan(plan: Plan, out_dir: Path | None) -> SavedPlan:
    """Write the rankings (into `out_dir`, else into the state directory; only a plan from routing statistics
    has them) and, with `out_dir`, plan.json and plan.env beside them."""
    require_finite(plan.model_dump(mode="json"), what="the plan")
    rankings_dir = out_dir if out_dir is not None else (state_dir() if plan.cache.rankings is not None else None)
    where = "--out" if out_dir is not None else "the rankings directory ($XDG_STATE_HOME/glm53/plan)"
    rankings = write_rankings(plan, rankings_dir, what=where) if rankings_dir is not None else None
    plan = plan.model_copy(update={"rankings_file": str(rankings) if rankings else None})
    env = plan_env(plan, rankings)
    if out_dir is None:
        return SavedPlan(plan, env, rankings, ())
    make_out_dir(out_dir)
    files = (out_dir / "plan.json", out_dir / "plan.env")
    atomic_write_json(files[0], plan.model_dump(mode="json"))
    atomic_write_text(files[1], env_lines(env))
    return SavedPlan(plan, env, rankings, files)


def main_cpus(plan: Plan) -> tuple[int, ...]:
    """The CPU affinity set for the serving process (what HYBRID_MAIN_CPUS names)."""
    return plan.cpu_sets.main_cpus


def plan_serving_env(
    profile: object,
    *,
    model_dir: Path | None = None,
    stats_path: Path | None = None,
    out_dir: Path | None = None,
    gpus: list[GpuSpec] | None = None,
    root: Path = Path("/"),
) -> tuple[dict[str, str], tuple[int, ...]]:
    """For the serving entrypoint: plan the profile on this host; (env to export, CPU affinity of the server).

    `profile` is a glm53.recipe.profiles.Profile (read through its `value(KEY)`); GPUs come from NVML unless given;
    the rankings file, when routing statistics are given, goes to `out_dir`.
    """
    plan = plan_for_host(shape_from_profile(profile), model_dir=model_dir, stats_path=stats_path, gpus=gpus, root=root)
    rankings = write_rankings(plan, out_dir) if out_dir is not None else None
    return plan_env(plan, rankings), main_cpus(plan)


__all__ = [
    "PLANNED_KEYS",
    "PLANNED_KEYS_EXL3",
    "RANKINGS_FILENAME",
    "SavedPlan",
    "capacity_plan_text",
    "main_cpus",
    "parse_capacity_plan",
    "plan_env",
    "plan_serving_env",
    "save_plan",
    "state_dir",
    "write_rankings",
]
