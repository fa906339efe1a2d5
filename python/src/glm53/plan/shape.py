"""The serving shape the planner sizes for: the recipe's values, or a serving profile's, with the ones given
on the command line over them."""

from __future__ import annotations

from pydantic import ValidationError

from glm53.errors import BadInput
from glm53.plan.planner import ServingShape, shape_from_profile
from glm53.plan.sizes import parse_size
from glm53.recipe.profiles import load_profile

# The flag that sets each field, to name it when a value is out of range.
FLAGS = {
    "tensor_parallel_size": "--tp",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "pool_threads": "--pool-threads",
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "gpu_workspace_bytes": "--gpu-workspace",
}


def serving_shape(
    profile: str | None,
    *,
    tensor_parallel_size: int | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float | None = None,
    pool_threads: int | None = None,
    kv_cache_memory: str | None = None,
    gpu_workspace: str | None = None,
) -> ServingShape:
    """Values left None keep the profile's (or the recipe's). `kv_cache_memory` is a size, or 'derive' to size
    the KV cache for the context; `gpu_workspace` a size over the estimate."""
    base = shape_from_profile(load_profile(profile)) if profile is not None else ServingShape()
    given: dict[str, object] = {
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "gpu_memory_utilization": gpu_memory_utilization,
        "pool_threads": pool_threads,
    }
    updates = {key: value for key, value in given.items() if value is not None}
    if kv_cache_memory is not None:  # "derive" sets it to None on purpose: size KV for the context
        updates["kv_cache_memory_bytes"] = (
            None
            if kv_cache_memory == "derive"
            else parse_size(kv_cache_memory, flag="--kv-cache-memory", positive=True)
        )
    if gpu_workspace is not None:
        updates["gpu_workspace_bytes"] = parse_size(gpu_workspace, flag="--gpu-workspace")
    try:
        return ServingShape.model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        given_by = FLAGS.get(field, field) if field in updates or profile is None else f"profile {profile}: {field}"
        raise BadInput(
            f"{given_by} {error.get('input')!r}: {error['msg']}", hint="see `glm53 plan --help` for the ranges"
        ) from exc


__all__ = ["serving_shape"]
