"""ServingShape's defaults are the recipe's default profile's values, read from its data file: one source."""

from __future__ import annotations

import pytest

from glm53.errors import BadInput
from glm53.plan.inputs import shape as shape_module
from glm53.plan.inputs.shape import PROFILE_KEYS, ServingShape, serving_shape
from glm53.recipe.profiles import DEFAULT_PROFILE, KEYS, load_profile


def _profile_value(key: str) -> int | float:
    raw = load_profile(DEFAULT_PROFILE).value(key)
    assert raw != "", f"{DEFAULT_PROFILE} sets {key}"
    return int(raw) if KEYS[key].kind == "int" else float(raw)


def test_the_defaults_are_the_default_profiles_values() -> None:
    defaults = ServingShape()
    for field, key in PROFILE_KEYS.items():
        assert getattr(defaults, field) == _profile_value(key), field
    # no profile and the default profile plan the same shape
    assert serving_shape(None) == serving_shape(DEFAULT_PROFILE)


def test_a_changed_profile_moves_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = load_profile(DEFAULT_PROFILE, overrides=[("MAX_MODEL_LEN", "131072"), ("KV_CACHE_MEMORY_BYTES", "")])
    monkeypatch.setattr(shape_module, "recipe_profile", lambda: changed)
    assert ServingShape().max_model_len == 131_072
    # KV_CACHE_MEMORY_BYTES left empty: derived for the context
    assert ServingShape().kv_cache_memory_bytes is None
    assert serving_shape(None, {"max_num_seqs": 2}).max_model_len == 131_072


def test_a_key_the_profile_leaves_empty_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = load_profile(DEFAULT_PROFILE, overrides=[("MAX_NUM_SEQS", "")])
    monkeypatch.setattr(shape_module, "recipe_profile", lambda: empty)
    with pytest.raises(BadInput, match=f"profile {DEFAULT_PROFILE} leaves MAX_NUM_SEQS empty"):
        ServingShape()
    # a value given over it needs no default
    assert ServingShape(max_num_seqs=4).max_num_seqs == 4
