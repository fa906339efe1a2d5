"""Model facts from the packaged data file and from a tiny checkpoint's config and headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.plan.inputs.model import load_architecture, read_checkpoint_facts
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint


def test_published_facts_give_the_measured_expert_size() -> None:
    model = load_architecture()
    assert model.expert_bytes == 9_474_060
    assert model.moe_layers == tuple(range(3, 45))
    assert model.total_experts == 42 * 288
    assert model.routed_expert_bytes == 114_598_229_760
    assert model.dsa_layers == (3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43)
    # TP=2: trellis halves, gate/up keep suh (input) whole, down keeps svh (output) whole.
    assert model.expert_bytes_per_rank(2) == 4_718_592 + 2 * (8192 + 2048) + (2048 + 8192) + 12
    # The published total less MTP and experts is the rest.
    assert (
        model.non_expert_replicated_bytes + model.non_expert_sharded_bytes
        == 125_263_712_676 - 2_862_179_364 - 114_598_229_760
    )


def test_tiny_checkpoint_headers(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ckpt")
    model = read_checkpoint_facts(root)
    # hidden 64, moe_intermediate 32, 3 bits: trellis (4,2,48) or (2,4,48) int16 = 768 B;
    # suh/svh fp16; mul1 int32.
    assert model.expert_bytes == 3 * (768 + 4) + 2 * (128 + 64) + (64 + 128)
    assert model.expert_bytes_per_rank(2) == 3 * (384 + 4) + 2 * (128 + 32) + (32 + 128)
    assert model.moe_layers == (3, 4, 5, 6, 7)
    assert model.dsa_layers == (3, 7)
    assert model.n_routed_experts == 8
    assert model.mtp_bytes > 0  # the MTP block is read but not counted as served weights
    assert model.kv_lora_rank == 32
    assert model.source.startswith("checkpoint")


def test_missing_expert_names_the_layer(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ckpt")
    config = json.loads((root / "config.json").read_text())
    config["text_config"]["n_routed_experts"] = 9
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInput, match=r"layer 3 lacks routed experts \[8\] of 9"):
        read_checkpoint_facts(root)


def test_config_without_required_field(tmp_path: Path) -> None:
    root = write_tiny_glm53_checkpoint(tmp_path / "ckpt")
    config = json.loads((root / "config.json").read_text())
    del config["text_config"]["kv_lora_rank"]
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInput, match=r"text_config\.kv_lora_rank"):
        read_checkpoint_facts(root)


def test_tp_that_does_not_divide_the_expert(tmp_path: Path) -> None:
    model = read_checkpoint_facts(write_tiny_glm53_checkpoint(tmp_path / "ckpt"))
    with pytest.raises(BadInput, match="cannot be split over 3 ranks"):
        model.expert_bytes_per_rank(3)
