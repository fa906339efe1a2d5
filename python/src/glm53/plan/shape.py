"""The serving shape the planner sizes for: the recipe's values, or a serving profile's, with the ones given
on the command line over them."""

from __future__ import annotations

from glm53.plan.planner import ServingShape, shape_from_profile
from glm53.plan.sizes import parse_size


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
    if profile is not None:
        from glm53.serve.profiles import load_profile

        base = shape_from_profile(load_profile(profile))
    else:
        base = ServingShape()
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
            None if kv_cache_memory == "derive" else parse_size(kv_cache_memory, flag="--kv-cache-memory")
        )
    if gpu_workspace is not None:
        updates["gpu_workspace_bytes"] = parse_size(gpu_workspace, flag="--gpu-workspace")
    return ServingShape.model_validate({**base.model_dump(), **updates})


__all__ = ["serving_shape"]
