"""Plans for the recipe rig and other fixture hosts: golden figures, infeasible requests, statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.host.facts import read_host_facts
from glm53.plan.inputs.gpus import GpuSpec
from glm53.plan.inputs.host_budget import Infeasible
from glm53.plan.inputs.model import (
    ModelFacts,
    load_architecture,
    read_checkpoint_facts,
)
from glm53.plan.routing.traces import SyntheticTraceSpec, synthesize_trace
from glm53.plan.vllm.env import parse_capacity_plan, plan_env
from glm53.plan.vllm.planner import ServingShape, build_plan
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
GIB = 1 << 30
RTX_3090 = [GpuSpec(index=i, name="RTX 3090", total_bytes=24 * GIB) for i in range(2)]


def test_recipe_rig_plans_feasibly() -> None:
    plan = build_plan(
        load_architecture(), read_host_facts(HOSTS / "threadripper-5975wx-cgv2"), RTX_3090, ServingShape()
    )
    gpu = plan.gpus[0]
    assert gpu.budget_bytes == int(24 * GIB * 0.94)
    assert gpu.weights_bytes == 110_684_416 + 7_692_619_136 // 2
    assert gpu.kv_bytes == 3_328_599_040
    assert gpu.expert_slot_bytes == 4_749_324
    assert gpu.staging_slots == 8  # one decode step's top-8 misses of one layer
    assert gpu.staging_bytes == 8 * 4_749_324
    assert gpu.expert_slots == 3106  # 25.7% of the 12,096 routed experts, after the staging
    assert 0 <= gpu.unused_bytes < gpu.expert_slot_bytes
    assert plan.host.pinned_pool_bytes == 2 * 12_096 * 4_749_324
    assert plan.host.budget_bytes == 120 * GIB
    assert plan.host.cpu_offload_gb == 54
    assert plan.kv.tokens == 258_862
    assert plan.cache.strategy == "uniform-lru"
    assert {layer.slots for layer in plan.cache.layers} == {73, 74}
    env = plan_env(plan)
    assert env == {
        "CPU_OFFLOAD_GB": "54",
        "KV_CACHE_MEMORY_BYTES": "3328599040",
        "EXL3_LRU_CAPACITY_PLAN": ",".join(f"{n}:{74 if n < 43 else 73}:0" for n in range(3, 45)),
        "EXL3_PINNED_FRAC": "0.0000",
        "HYBRID_MAIN_CPUS": "0-33,40-41,48-49,56-57",
        "EXL3_HYBRID_CPU": "2-7,18-23;10-15,26-31",
        "EXL3_HYBRID_LAYERS": "3-44",
        "OMP_NUM_THREADS": "12",
    }
    # The KV shortfall by the derivation is a warning that points at the explanation, not an error.
    assert any("258,862" in warning for warning in plan.warnings)


def test_small_gpus_name_the_largest_context_that_fits() -> None:
    gpus = [GpuSpec(index=i, total_bytes=10 * GIB) for i in range(2)]
    with pytest.raises(Infeasible, match="expert slots") as info:
        build_plan(load_architecture(), read_host_facts(HOSTS / "threadripper-5975wx-cgv2"), gpus, ServingShape())
    assert info.value.constraint == "gpu0 memory (KV cache)"
    assert info.value.fix is not None and "largest context that fits is" in info.value.fix
    assert info.value.exit_code == 1


def test_tiny_gpus_cannot_hold_the_weights() -> None:
    gpus = [GpuSpec(index=i, total_bytes=6 * GIB) for i in range(2)]
    with pytest.raises(Infeasible, match="exceed its budget") as info:
        build_plan(load_architecture(), read_host_facts(HOSTS / "threadripper-5975wx-cgv2"), gpus, ServingShape())
    assert info.value.fix is not None and "TENSOR_PARALLEL_SIZE=4" in info.value.fix


def test_desktop_ram_is_the_binding_constraint() -> None:
    with pytest.raises(Infeasible, match="host memory") as info:
        build_plan(load_architecture(), read_host_facts(HOSTS / "desktop-8core-cgv1"), RTX_3090, ServingShape())
    assert info.value.constraint == "host memory"
    assert info.value.fix == "needs 117.00 GiB of budget: 128 GiB of RAM (8.00 GiB stays with the system)"


def test_cgroup_limit_below_memtotal_binds() -> None:
    with pytest.raises(Infeasible, match=r"cgroup v2 limit") as info:
        build_plan(
            load_architecture(),
            read_host_facts(HOSTS / "threadripper-3970x-cgv2-limit"),
            RTX_3090,
            ServingShape(),
        )
    assert info.value.fix == (
        "raise the cgroup memory limit to at least 117.00 GiB (systemd MemoryMax=, docker --memory)"
    )


def test_more_tensor_parallelism_than_gpus() -> None:
    with pytest.raises(Infeasible, match="needs 2 GPUs, 1 given"):
        build_plan(
            load_architecture(),
            read_host_facts(HOSTS / "threadripper-5975wx-cgv2"),
            RTX_3090[:1],
            ServingShape(),
        )


def test_gpu_memory_already_in_use() -> None:
    busy = [GpuSpec(index=0, total_bytes=24 * GIB, used_bytes=3 * GIB), RTX_3090[1]]
    with pytest.raises(Infeasible, match=r"GPU 0 already has 3\.00 GiB in use"):
        build_plan(load_architecture(), read_host_facts(HOSTS / "threadripper-5975wx-cgv2"), busy, ServingShape())


def _tiny_setup(tmp_path: Path) -> tuple[ModelFacts, ServingShape, list[GpuSpec]]:
    model = read_checkpoint_facts(write_tiny_glm53_checkpoint(tmp_path / "ckpt"))
    shape = ServingShape(
        max_model_len=4096,
        kv_cache_memory_bytes=1 << 20,
        gpu_workspace_bytes=0,
        gpu_headroom_bytes=0,
        max_num_batched_tokens=64,
    )
    slot = model.expert_bytes_per_rank(2)
    total = model.non_expert_bytes_per_rank(2) + (1 << 20) + 20 * slot  # room for 20 of the 40 experts
    gpus = [GpuSpec(index=i, total_bytes=int(total / 0.94) + 1) for i in range(2)]
    return model, shape, gpus


def test_tiny_checkpoint_with_a_trace_learns_the_split(tmp_path: Path) -> None:
    model, shape, gpus = _tiny_setup(tmp_path)
    trace = synthesize_trace(
        SyntheticTraceSpec(
            layers=(3, 4, 5, 6, 7), experts=8, top_k=2, steps=400, locality=0.3, skew_min=0.2, skew_max=1.5
        )
    )
    plan = build_plan(
        model,
        read_host_facts(HOSTS / "desktop-8core-cgv1"),
        gpus,
        shape,
        stats=trace,
        stats_source="synthetic",
        learn_fraction=0.5,
    )
    assert plan.cache.strategy == "trace"
    assert plan.cache.total_slots == 18  # room for 20, less 2 of staging (one step's top-2 misses)
    assert all(layer.slots >= 2 for layer in plan.cache.layers)
    assert plan.cache.learned_steps == 200 and plan.cache.scored_steps == 200
    assert plan.cache.expected_hit_rate is not None and 0.0 < plan.cache.expected_hit_rate <= 1.0
    assert plan.cache.rankings is not None and sorted(plan.cache.rankings["3"]) == list(range(8))
    parsed = parse_capacity_plan(plan_env(plan)["EXL3_LRU_CAPACITY_PLAN"])
    assert parsed == {layer.layer: (layer.slots, layer.pinned) for layer in plan.cache.layers}


def test_counts_only_pin_every_slot(tmp_path: Path) -> None:
    model, shape, gpus = _tiny_setup(tmp_path)
    counts = synthesize_trace(SyntheticTraceSpec(layers=(3, 4, 5, 6, 7), experts=8, top_k=2, steps=300)).to_counts()
    plan = build_plan(
        model,
        read_host_facts(HOSTS / "desktop-8core-cgv1"),
        gpus,
        shape,
        stats=counts,
        stats_source="counts.json",
    )
    assert plan.cache.strategy == "counts"
    assert all(layer.pinned == layer.slots and layer.window == 0 for layer in plan.cache.layers)
    assert plan_env(plan)["EXL3_PINNED_FRAC"] == "1.0000"


def test_statistics_for_other_layers_are_rejected(tmp_path: Path) -> None:
    from glm53.errors import BadInput

    model, shape, gpus = _tiny_setup(tmp_path)
    trace = synthesize_trace(SyntheticTraceSpec(layers=(1, 2), experts=8, top_k=2, steps=20))
    with pytest.raises(BadInput, match=r"covers layers \[1, 2\]"):
        build_plan(model, read_host_facts(HOSTS / "desktop-8core-cgv1"), gpus, shape, stats=trace)


GOLDEN = Path(__file__).parent / "fixtures" / "plan" / "recipe-rig.plan.json"


def test_recipe_rig_golden_plan() -> None:
    """The whole plan, byte for byte; regenerate with GLM53_UPDATE_GOLDEN=1 after an intended change."""
    import json
    import os

    plan = build_plan(
        load_architecture(), read_host_facts(HOSTS / "threadripper-5975wx-cgv2"), RTX_3090, ServingShape()
    )
    text = json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    if os.environ.get("GLM53_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_ledger_reserves_the_staging_the_cache_model_assumes() -> None:
    """The simulator loads a step's misses after its lookups: the ledger holds room for them, and every byte of
    the budget is accounted for."""
    for seqs in (1, 4):
        plan = build_plan(
            load_architecture(),
            read_host_facts(HOSTS / "threadripper-5975wx-cgv2"),
            RTX_3090,
            ServingShape(max_num_seqs=seqs),
        )
        gpu = plan.gpus[0]
        assert gpu.staging_slots == 8 * seqs
        assert gpu.staging_bytes == gpu.staging_slots * gpu.expert_slot_bytes
        parts = gpu.weights_bytes + gpu.kv_bytes + gpu.workspace_bytes + gpu.headroom_bytes
        assert parts + gpu.staging_bytes + gpu.expert_cache_bytes + gpu.unused_bytes == gpu.budget_bytes
        assert 0 <= gpu.unused_bytes < gpu.expert_slot_bytes
