"""The serving shape the planner sizes for: the recipe's values, or a serving profile's, with the ones given
on the command line over them; the CLI builds its options from ServingShape.

The recipe's values are its default profile's (glm53.recipe.profiles.DEFAULT_PROFILE, a data file): each field
a profile sets takes its default from there, so that editing the profile moves the planner's defaults and
`glm53 plan host --help` with them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.constants import GIB, MIB
from glm53.errors import BadInput
from glm53.recipe.profiles import DEFAULT_PROFILE, KEYS, Profile, load_profile

# The fields a serving profile sets, and the profile key of each (the recipe's key names).
PROFILE_KEYS: dict[str, str] = {
    "tensor_parallel_size": "TENSOR_PARALLEL_SIZE",
    "max_model_len": "MAX_MODEL_LEN",
    "max_num_seqs": "MAX_NUM_SEQS",
    "max_num_batched_tokens": "MAX_NUM_BATCHED_TOKENS",
    "gpu_memory_utilization": "GPU_MEMORY_UTILIZATION",
    "kv_cache_memory_bytes": "KV_CACHE_MEMORY_BYTES",
}
# Where the recipe's profile may leave a key empty: None (KV_CACHE_MEMORY_BYTES: derived for the context).
_EMPTY_IS_NONE = frozenset({"kv_cache_memory_bytes"})


@functools.cache
def recipe_profile() -> Profile:
    """The recipe's default profile, as packaged (no environment, no --set): where the shape's defaults live."""
    return load_profile(DEFAULT_PROFILE)


def _number(key: str, raw: str) -> int | float:
    return int(raw) if KEYS[key].kind == "int" else float(raw)


def _recipe(field: str) -> Callable[[], Any]:
    """The default of `field`: its key's value in the recipe's default profile (an int or a float, as the key's
    kind; the model validates it against the field)."""
    key = PROFILE_KEYS[field]

    def default() -> int | float | None:
        raw = recipe_profile().value(key)
        if raw != "":
            return _number(key, raw)
        if field in _EMPTY_IS_NONE:
            return None
        raise BadInput(
            f"profile {DEFAULT_PROFILE} leaves {key} empty: the planner takes its default from there",
            fix=f"set {key} in data/profiles/{DEFAULT_PROFILE}.env",
        )

    return default


class ServingShape(BaseModel):
    """The profile values the planner reads (recipe key names in the descriptions); the defaults of those a
    profile sets are the recipe's default profile's (PROFILE_KEYS), read from its file."""

    # validate_default: a value taken from the profile is held to the field's bounds like a given one
    model_config = ConfigDict(frozen=True, validate_default=True)

    tensor_parallel_size: int = Field(
        default_factory=_recipe("tensor_parallel_size"),
        ge=1,
        description="TENSOR_PARALLEL_SIZE: GPUs the model is split over.",
    )
    max_model_len: int = Field(
        default_factory=_recipe("max_model_len"), gt=0, description="MAX_MODEL_LEN: the longest context, in tokens."
    )
    max_num_seqs: int = Field(
        default_factory=_recipe("max_num_seqs"), ge=1, description="MAX_NUM_SEQS: sequences served at once."
    )
    max_num_batched_tokens: int = Field(
        default_factory=_recipe("max_num_batched_tokens"),
        gt=0,
        description="MAX_NUM_BATCHED_TOKENS: tokens per engine step (the prefill chunk).",
    )
    gpu_memory_utilization: float = Field(
        default_factory=_recipe("gpu_memory_utilization"),
        gt=0.0,
        le=1.0,
        description="GPU_MEMORY_UTILIZATION: the share of each GPU vLLM may use.",
    )
    # None: derive it for the context
    kv_cache_memory_bytes: int | None = Field(
        default_factory=_recipe("kv_cache_memory_bytes"),
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
    """A ServingShape from a glm53.recipe.profiles.Profile (its `value(KEY)` strings; empty = the recipe default,
    KV_CACHE_MEMORY_BYTES empty = derived for the context). Duck-typed on `value`."""
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
            f"profile value {PROFILE_KEYS.get(field, field.upper())}={error.get('input')!r}: {error['msg']}",
            fix="fix that value of the profile (or give the flag over it)",
        ) from exc


def serving_shape(profile: str | None, overrides: Mapping[str, object] | None = None) -> ServingShape:
    """The profile's values (the recipe's, ServingShape's defaults, without one) with `overrides`, ServingShape
    fields, over them. A value out of range raises pydantic's ValidationError naming the field: the caller
    knows which flag or key gave it (glm53.cli.model_options.flag_error)."""
    base = shape_from_profile(load_profile(profile)) if profile is not None else ServingShape()
    return ServingShape.model_validate({**base.model_dump(), **(overrides or {})})


__all__ = ["PROFILE_KEYS", "ServingShape", "recipe_profile", "serving_shape", "shape_from_profile"]
