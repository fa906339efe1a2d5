"""The KV derivation and its comparison with the recipe's reported figure."""

from __future__ import annotations

from glm53.plan.inputs.kv import compare_with_reported, derive_kv
from glm53.plan.inputs.model import load_architecture


def test_derivation_per_token_and_per_sequence() -> None:
    kv = derive_kv(load_architecture(), tensor_parallel_size=2)
    assert kv.latent_bytes_per_layer == 512 * 2
    assert kv.indexer_key_bytes_per_layer == 128 + 4
    assert kv.bytes_per_token == 11 * (1024 + 132)
    # 34 KDA layers: fp32 32x128x128 state + bf16 conv tails (3 x 32 x 384), split over 2 GPUs.
    assert kv.kda_state_bytes_per_layer == 32 * 128 * 128 * 4 + 3 * 32 * 384 * 2
    assert kv.kda_state_bytes_per_sequence == 34 * kv.kda_state_bytes_per_layer // 2
    assert kv.kda_state_assumed
    tokens = kv.tokens_for(3_328_599_040)
    assert kv.bytes_for(tokens) <= 3_328_599_040 < kv.bytes_for(tokens + 1)


def test_recipe_gap_is_reported_not_fitted() -> None:
    comparison = compare_with_reported(derive_kv(load_architecture(), 2))
    assert comparison.reported_tokens == 264_160
    assert comparison.derived_tokens == 258_862
    assert comparison.gap_tokens == 264_160 - 258_862
    assert 0.0 < comparison.gap_fraction < 0.03
    assert "not fitted" in comparison.explanation
