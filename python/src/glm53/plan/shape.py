"""The serving shape the planner sizes for: the recipe's values, or a serving profile's, with the ones given
on the command line over them; the CLI builds its options from ServingShape."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.constants import GIB, MIB
from glm53.errors import BadInput
from glm53.recipe.profiles import load_profile


class ServingShape(BaseModel):
    """The profile values the planner reads (recipe key names in the comments); defaults are the recipe's."""

    model_config = ConfigDict(frozen=True)

    tensor_parallel_size: int = Field(
        default=2, ge=1, description="TENSOR_PARALLEL_SIZE: GPUs the model is split over."
    )
    max_model_len: int = Field(default=262_144, gt=0, description="MAX_MODEL_LEN: the longest context, in tokens.")
    max_num_seqs: int = Field(default=1, ge=1, description="MAX_NUM_SEQS: sequences served at once.")
    max_num_batched_tokens: int = Field(
        default=8192, gt=0, description="MAX_NUM_BATCHED_TOKENS: tokens per engine step (the prefill chunk)."
    )
    gpu_memory_utilization: float = Field(
        default=0.94, gt=0.0, le=1.0, description="GPU_MEMORY_UTILIZATION: the share of each GPU vLLM may use."
    )
    # None: derive it for the context
    kv_cache_memory_bytes: int | None = Field(
        default=3_328_599_040,
        gt=0,
        description="KV_CACHE_MEMORY_BYTES: the KV cache per GPU; 'derive' sizes it for the context.",
    )
    gpu_workspace_bytes: int | None = Field(
        default=None, ge=0, description="Workspace per GPU, instead of the estimate."
    )
    gpu_headroom_bytes: int = Field(default=512 * MIB, ge=0)
    host_reserve_bytes: int = Field(default=8 * GIB, ge=0)
    serving_overhead_bytes: int = Field(default=10 * GIB, ge=0)
    pool_threads: int | None = Field(default=None, ge=0, description="Cap on the CPU pool threads, over all ranks.")
    decode_context_tokens: int = Field(default=8192, gt=0)  # context at which decode speed is predicted


def shape_from_profile(profile: object) -> ServingShape:
    """A ServingShape from a glm53.recipe.profiles.Profile (its `value(KEY)` strings; empty = the recipe default).

    Duck-typed on `value` so that the planner does not depend on the profile module.
    """
    value = profile.value  # type: ignore[attr-defined]
    defaults = ServingShape()

    def number(key: str, kind: type[int] | type[float], default: float | None) -> float | None:
        raw = str(value(key) or "")
        if raw == "":
            return default
        try:
            return kind(raw)
        except ValueError as exc:
            raise BadInput(f"profile value {key}={raw!r} is not a {kind.__name__}") from exc

    def integer(key: str, default: int | None) -> int | None:
        result = number(key, int, default)
        return None if result is None else int(result)

    values = {
        "tensor_parallel_size": integer("TENSOR_PARALLEL_SIZE", defaults.tensor_parallel_size) or 1,
        "max_model_len": integer("MAX_MODEL_LEN", defaults.max_model_len) or defaults.max_model_len,
        "max_num_seqs": integer("MAX_NUM_SEQS", defaults.max_num_seqs) or 1,
        "max_num_batched_tokens": integer("MAX_NUM_BATCHED_TOKENS", defaults.max_num_batched_tokens)
        or defaults.max_num_batched_tokens,
        "gpu_memory_utilization": number("GPU_MEMORY_UTILIZATION", float, defaults.gpu_memory_utilization)
        or defaults.gpu_memory_utilization,
        "kv_cache_memory_bytes": integer("KV_CACHE_MEMORY_BYTES", None),
    }
    try:
        return ServingShape(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        raise BadInput(
            f"profile value {field.upper()}={error.get('input')!r}: {error['msg']}",
            hint="fix that value of the profile (or give the flag over it)",
        ) from exc


def serving_shape(profile: str | None, overrides: Mapping[str, object] | None = None) -> ServingShape:
    """The profile's values (the recipe's, ServingShape's defaults, without one) with `overrides`, ServingShape
    fields, over them. A value out of range raises pydantic's ValidationError naming the field: the caller
    knows which flag or key gave it (glm53.cli.model_options.flag_error)."""
    base = shape_from_profile(load_profile(profile)) if profile is not None else ServingShape()
    return ServingShape.model_validate({**base.model_dump(), **(overrides or {})})


__all__ = ["ServingShape", "serving_shape", "shape_from_profile"]
