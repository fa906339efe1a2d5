"""The ExLlamaV3 planner (glm53.plan.exllamav3.split): ledgers, the offload choice, the decode model, dynamic placement,
the stats file and rigs; then `glm53 plan host --profile exl3-*` through the CLI entry point."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from glm53.constants import GIB
from glm53.errors import BadInput
from glm53.host.rig import Rig, RigGpu, load_rig, rig_topology
from glm53.plan.cache.policies import exl3_dynamic
from glm53.plan.cache.recommend import SCORED_STEPS, TOLERANCE
from glm53.plan.exllamav3.split import (
    ALLOCATOR_SLACK_BYTES,
    CUDA_CONTEXT_BYTES,
    HEADROOM_BYTES,
    Exl3Plan,
    Exl3Shape,
    compare_placements,
    kv_bytes_per_token,
    layer_non_expert_bytes,
    parse_cache_mode,
    plan_exl3_for_host,
    predict,
    split_stats,
    static_cpu_experts,
)
from glm53.plan.inputs.gpus import GpuSpec
from glm53.plan.inputs.host_budget import Infeasible
from glm53.plan.inputs.model import ModelFacts, load_architecture
from glm53.plan.routing.traces import RoutingTrace, SyntheticTraceSpec, synthesize_trace, write_counts, write_trace
from glm53.recipe.profiles import load_profile
from tests.support.cli import run_with_capsys as run

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
MIB = 1 << 20


@pytest.fixture(scope="module")
def model() -> ModelFacts:
    return load_architecture()


def plan_for(profile: str, rig: Rig | str, **kwargs: object) -> Exl3Plan:
    described = load_rig(rig) if isinstance(rig, str) else rig
    return plan_exl3_for_host(load_profile(profile), rig=described, **kwargs)  # type: ignore[arg-type]


def a_rig(name: str, gpu_gib: Sequence[int], ram_gib: int, cores: int = 16) -> Rig:
    return Rig(
        name=name,
        gpus=[RigGpu(name=f"{size} GiB GPU", memory_bytes=size * GIB) for size in gpu_gib],
        ram_bytes=ram_gib * GIB,
        cores=cores,
    )


# --- an independent packer: ExLlamaV3's autosplit fills each GPU in layer order up to its budget -------------


def pack(model: ModelFacts, plan: Exl3Plan, cpu_experts: dict[int, int]) -> list[list[int]] | None:
    """Layers per GPU with `cpu_experts[layer]` routed experts of each MoE layer on the CPU, the plan's budgets,
    cache and state; None when a layer is left over."""
    dsa = set(model.dsa_layers)
    kv_layer = plan.cache_size * plan.kv_bytes_per_token // len(model.dsa_layers)
    state_layer = plan.recurrent_bytes_per_sequence // len(model.kda_layers) * plan.shape.max_num_seqs
    non_expert = layer_non_expert_bytes(model)
    layers = iter(range(model.num_hidden_layers))
    layer: int | None = next(layers)
    placed: list[list[int]] = []
    for gpu in plan.gpus:
        used = gpu.scratch_bytes
        mine: list[int] = []
        while layer is not None:
            resident = model.n_routed_experts - cpu_experts.get(layer, 0) if layer in model.moe_layers else 0
            cost = non_expert[layer] + resident * model.expert_bytes + (kv_layer if layer in dsa else state_layer)
            if used + cost > gpu.budget_bytes:
                break
            used += cost
            mine.append(layer)
            layer = next(layers, None)
        placed.append(mine)
    return placed if layer is None else None


def split(model: ModelFacts, k: int, layers: int) -> dict[int, int]:
    return {layer: k for layer in model.moe_layers[:layers]}


def check_ledgers(model: ModelFacts, plan: Exl3Plan) -> None:
    """Every layer once and in order; every GPU within its budget; the budget and GPU_SPLIT from the terms."""
    assert [layer for gpu in plan.gpus for layer in gpu.layers] == list(range(model.num_hidden_layers))
    splits = []
    for gpu in plan.gpus:
        used = (
            gpu.non_expert_bytes + gpu.expert_bytes + gpu.kv_cache_bytes + gpu.recurrent_state_bytes + gpu.scratch_bytes
        )
        assert used <= gpu.budget_bytes and gpu.free_bytes == gpu.budget_bytes - used
        assert gpu.expert_bytes == gpu.resident_experts * model.expert_bytes
        # TabbyAPI's gpu_split: what torch may reserve, floored to 0.01 GiB; ExLlamaV3 reads int(x * 1024**3).
        cap_gib = math.floor(
            (gpu.total_bytes - gpu.used_by_others_bytes - CUDA_CONTEXT_BYTES - HEADROOM_BYTES) / GIB * 100
        )
        splits.append(f"{cap_gib / 100:.2f}")
        assert gpu.gpu_split_bytes == int(cap_gib / 100 * 1024**3)
        # budget = memory - context - headroom - slack, less what the 0.01 GiB floor drops (under 10.24 MiB)
        exact = gpu.total_bytes - gpu.used_by_others_bytes - CUDA_CONTEXT_BYTES - HEADROOM_BYTES - ALLOCATOR_SLACK_BYTES
        assert gpu.budget_bytes == gpu.gpu_split_bytes - ALLOCATOR_SLACK_BYTES
        assert 0 <= exact - gpu.budget_bytes < GIB // 100 + 1
    assert plan.env["GPU_SPLIT"] == ",".join(splits)
    assert plan.env["CACHE_SIZE"] == str(plan.cache_size)


def check_minimal_split(model: ModelFacts, plan: Exl3Plan) -> None:
    k, layers = plan.offload.split_experts, plan.offload.split_layers
    assert plan.host.cpu_experts == k * layers
    assert plan.host.cpu_expert_bytes == k * layers * model.expert_bytes
    assert plan.env["EXL3_MOE_CPU_SPLIT"] == str(k) and plan.env["EXL3_MOE_CPU_SPLIT_LAYERS"] == str(layers)
    assert plan.env["CPU_MOE_OFFLOAD_LAYERS"] == "0"
    # The packer reproduces the plan's placement, and neither one expert fewer per layer nor one layer fewer fits.
    assert pack(model, plan, split(model, k, layers)) == [gpu.layers for gpu in plan.gpus]
    assert pack(model, plan, split(model, k - 1, layers)) is None
    assert pack(model, plan, split(model, k - 1, len(model.moe_layers))) is None
    assert pack(model, plan, split(model, k, layers - 1)) is None


# --- ledgers and the offload choice --------------------------------------------------------------------------


def test_recipe_rig_two_3090s_split_mode(model: ModelFacts) -> None:
    plan = plan_for("exl3-2x3090", "recipe-2x3090")
    assert plan.offload.mode == "split" and plan.prediction.mode == "split"
    check_ledgers(model, plan)
    check_minimal_split(model, plan)
    assert plan.env["GPU_SPLIT"] == "23.16,23.16"  # 24 GiB - 600 MiB - 256 MiB = 23.164 GiB
    assert (plan.offload.split_experts, plan.offload.split_layers) == (200, 42)
    assert [(g.layers[0], g.layers[-1]) for g in plan.gpus] == [(0, 23), (24, 44)]
    assert plan.host.free_bytes > 0
    assert [p.mode for p in plan.alternatives] == ["offload"]
    assert plan.prediction.tokens_per_s > plan.alternatives[0].tokens_per_s


def test_one_3090_split_mode(model: ModelFacts) -> None:
    plan = plan_for("exl3-1gpu", "one-3090")
    assert plan.offload.mode == "split" and len(plan.gpus) == 1
    check_ledgers(model, plan)
    check_minimal_split(model, plan)
    assert plan.env["GPU_SPLIT"] == "23.16"
    # More experts on the CPU than with two GPUs, and a slower predicted rate.
    assert plan.offload.split_experts > 200
    assert plan.prediction.tokens_per_s < plan_for("exl3-2x3090", "recipe-2x3090").prediction.tokens_per_s


def test_four_80gib_gpus_hold_every_expert(model: ModelFacts) -> None:
    plan = plan_for("exl3-2x3090", a_rig("4x80", [80] * 4, 256), shape_overrides={"gpus": 4})
    assert plan.offload.mode == "gpu" and plan.host.cpu_experts == 0 and plan.host.worker_overhead_bytes == 0
    check_ledgers(model, plan)
    assert sum(gpu.resident_experts for gpu in plan.gpus) == model.total_experts
    assert plan.prediction.cpu_share == 0.0
    # Nothing goes to the CPU: the offload keys say 0 and neither the split layers nor worker threads are set.
    assert (plan.env["EXL3_MOE_CPU_SPLIT"], plan.env["CPU_MOE_OFFLOAD_LAYERS"]) == ("0", "0")
    assert "EXL3_MOE_CPU_SPLIT_LAYERS" not in plan.env and "EXL3_MOE_CPU_THREADS" not in plan.env


def test_forced_offload_takes_the_fewest_whole_layers(model: ModelFacts) -> None:
    plan = plan_for("exl3-2x3090", "recipe-2x3090", mode="offload")
    n = plan.offload.offload_layers
    assert plan.offload.mode == "offload" and plan.env["CPU_MOE_OFFLOAD_LAYERS"] == str(n)
    assert plan.env["EXL3_MOE_CPU_SPLIT"] == "0" and plan.alternatives == []
    assert plan.offload.cpu_layers == list(model.moe_layers[:n])
    assert plan.host.cpu_expert_bytes == n * model.n_routed_experts * model.expert_bytes
    check_ledgers(model, plan)
    whole = model.n_routed_experts
    assert pack(model, plan, split(model, whole, n)) == [gpu.layers for gpu in plan.gpus]
    assert pack(model, plan, split(model, whole, n - 1)) is None


def test_a_faster_mode_that_does_not_fit_in_ram_is_not_chosen() -> None:
    """Slow GPUs (100 GB/s) and a fast host (4 TB/s): whole-layer offload predicts faster than the split, but
    moves experts a layer (2.54 GiB) at a time and needs more RAM. With RAM between the two needs the split
    is chosen and the dropped mode is named."""
    gpus = [RigGpu(name="slow", memory_bytes=56 * GIB, memory_bandwidth=100e9)] * 2

    def rig(ram_gib: int) -> Rig:
        return Rig(name="fast host", gpus=gpus, ram_bytes=ram_gib * GIB, cores=16, memory_bandwidth=4e12)

    roomy = plan_for("exl3-2x3090", rig(256))
    assert roomy.offload.mode == "offload"
    (split_prediction,) = roomy.alternatives
    assert split_prediction.mode == "split" and split_prediction.tokens_per_s < roomy.prediction.tokens_per_s
    split_only = plan_for("exl3-2x3090", rig(256), mode="split")
    need = lambda plan: plan.host.budget_bytes - plan.host.free_bytes  # noqa: E731
    assert need(split_only) < 16 * GIB < need(roomy)  # 24 GiB of RAM less the 8 GiB reserve: 16 GiB budget
    tight = plan_for("exl3-2x3090", rig(24))
    assert tight.offload.mode == "split" and tight.alternatives == []
    assert tight.offload == split_only.offload
    assert [w for w in tight.warnings if w.startswith("offload mode would need")] == [
        f"offload mode would need {need(roomy) / GIB:.2f} GiB of RAM, over the budget of 16.00 GiB: not considered"
    ]


# --- KV cache ------------------------------------------------------------------------------------------------


def test_kv_bytes_per_token_on_the_published_facts(model: ModelFacts) -> None:
    # 11 DSA layers x (latent 512 x 2 B + indexer key 128 x 2 B); the published facts have no separate rope dims.
    assert len(model.dsa_layers) == 11
    assert kv_bytes_per_token(model, (16, 16)) == 11 * (512 * 2 + 128 * 2) == 14_080
    q8 = kv_bytes_per_token(model, (8, 8))
    q4 = kv_bytes_per_token(model, (4, 4))
    assert q4 < q8 < 14_080
    # Q8: the latent at 1 B a value plus an fp16 scale per 32 values; the indexer key stays fp16.
    assert q8 == 11 * (512 + 2 * 16 + 128 * 2)


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("FP16", (16, 16)),
        ("", (16, 16)),
        ("q8", (8, 8)),
        ("Q6", (6, 6)),
        ("Q4", (4, 4)),
        ("8,4", (8, 4)),
        (" 6 , 5 ", (6, 5)),
    ],
)
def test_parse_cache_mode(text: str, bits: tuple[int, int]) -> None:
    assert parse_cache_mode(text) == bits


@pytest.mark.parametrize("text", ["Q5", "FP32", "8", "9,9", "1,8", "8,4,2", "eight"])
def test_parse_cache_mode_refuses(text: str) -> None:
    with pytest.raises(BadInput, match="CACHE_MODE"):
        parse_cache_mode(text)


def test_a_quantized_cache_moves_experts_back_to_the_gpu() -> None:
    fp16 = plan_for("exl3-2x3090", "recipe-2x3090")
    q8 = plan_exl3_for_host(
        load_profile("exl3-2x3090", overrides=[("CACHE_MODE", "Q8")]), rig=load_rig("recipe-2x3090")
    )
    assert q8.host.cpu_experts < fp16.host.cpu_experts


# --- infeasible and bad input --------------------------------------------------------------------------------


def test_too_little_ram_names_the_gib_and_the_fix() -> None:
    with pytest.raises(Infeasible) as caught:
        plan_for("exl3-1gpu", a_rig("8 GiB", [24], 8))
    assert caught.value.constraint == "host memory"
    assert "GiB of experts" in caught.value.message and "budget of 0.00 GiB" in caught.value.message
    assert caught.value.fix is not None and "GiB of RAM" in caught.value.fix


def test_a_4gib_gpu_cannot_hold_even_the_non_expert_weights() -> None:
    with pytest.raises(Infeasible) as caught:
        plan_for("exl3-1gpu", a_rig("small", [4], 128))
    assert caught.value.constraint == "gpu memory"
    assert "even with every routed expert on the CPU" in caught.value.message
    assert "weights (7.27 GiB)" in caught.value.message  # the non-expert weights
    assert "more than the GPUs' 2.41 GiB" in caught.value.message  # floor(4 - 0.59 - 0.25) - 0.75 slack
    assert "MAX_MODEL_LEN" in (caught.value.fix or "") and "CHUNK_SIZE" in (caught.value.fix or "")


def test_the_gpu_need_that_does_not_fit_adds_up_to_more_than_the_gpu() -> None:
    """Every part the layer split must place is named, the prompt chunk's activations too, so the need stated
    is more than the budget stated."""
    with pytest.raises(Infeasible) as caught:
        plan_for("exl3-1gpu", a_rig("small", [4], 128))
    numbers = re.search(r"need ([0-9.]+) GiB, more than the GPUs' ([0-9.]+) GiB", caught.value.message)
    assert numbers is not None and float(numbers[1]) > float(numbers[2])
    assert "a prompt chunk of 2,048 tokens" in caught.value.message


def test_too_few_gpus_for_the_profile() -> None:
    with pytest.raises(Infeasible) as caught:
        plan_for("exl3-2x3090", "one-3090")
    assert caught.value.constraint == "gpus"
    assert "2 GPUs, 1 found (rig one-3090)" in caught.value.message
    assert "GPUS=1" in (caught.value.fix or "")


def test_cache_shorter_than_the_context_is_bad_input() -> None:
    with pytest.raises(BadInput, match="CACHE_SIZE=65536 is below MAX_MODEL_LEN=131072"):
        plan_for("exl3-1gpu", "one-3090", shape_overrides={"cache_size": 65_536})


def test_context_beyond_the_model_is_bad_input(model: ModelFacts) -> None:
    with pytest.raises(BadInput, match="beyond the model's 1,048,576 positions"):
        plan_for("exl3-1gpu", "one-3090", shape_overrides={"max_model_len": model.max_position_embeddings + 256})


# --- the decode model ----------------------------------------------------------------------------------------


def test_concentrated_routing_puts_less_on_the_cpu_and_decodes_faster(model: ModelFacts) -> None:
    gpus = [GpuSpec(index=i, total_bytes=24 * GIB, memory_bandwidth=936.2e9) for i in range(2)]
    shape = Exl3Shape(gpus=2, host_memory_bandwidth=120e9)
    cpu = split(model, 200, len(model.moe_layers))
    uniform = predict(model, gpus, shape, "split", cpu)
    # 16 hot experts take 90% of each layer's selections; the coldest 200 (on the CPU) share what is left.
    rng = np.random.default_rng(3)
    counts: dict[int, Sequence[float]] = {}
    for layer in model.moe_layers:
        row = np.full(model.n_routed_experts, 10.0)
        row[rng.choice(model.n_routed_experts, 16, replace=False)] = 9 * 10.0 * (model.n_routed_experts - 16) / 16
        counts[layer] = row.tolist()
    skewed = predict(model, gpus, shape, "split", cpu, counts)
    assert uniform.cpu_share == pytest.approx(200 / 288, abs=1e-4)
    assert skewed.cpu_share == pytest.approx(0.1 * 200 / 272, abs=1e-4)
    assert skewed.tokens_per_s > uniform.tokens_per_s
    assert skewed.cpu_seconds < uniform.cpu_seconds


def test_split_beats_whole_layer_offload_at_equal_cpu_bytes(model: ModelFacts) -> None:
    """Half the experts of all 42 layers, or all the experts of 21 layers: the same bytes on the CPU. The split
    overlaps each layer's CPU part with its GPU experts; whole-layer offload waits for the CPU."""
    gpus = [GpuSpec(index=i, total_bytes=24 * GIB, memory_bandwidth=936.2e9) for i in range(2)]
    shape = Exl3Shape(gpus=2, host_memory_bandwidth=120e9)
    half = split(model, model.n_routed_experts // 2, len(model.moe_layers))
    whole = split(model, model.n_routed_experts, len(model.moe_layers) // 2)
    assert sum(half.values()) == sum(whole.values())
    by_split = predict(model, gpus, shape, "split", half)
    by_offload = predict(model, gpus, shape, "offload", whole)
    assert by_split.cpu_share == pytest.approx(by_offload.cpu_share)
    assert by_split.tokens_per_s > by_offload.tokens_per_s
    # Without overlap the same split placement is slower than with it.
    assert predict(model, gpus, shape, "offload", half).tokens_per_s < by_split.tokens_per_s


# --- dynamic placement ---------------------------------------------------------------------------------------


def reference_dynamic(
    routes: NDArray[np.int16], experts: int, k: int, interval: int, hysteresis: float, floor: float, max_swaps: int
) -> tuple[list[int], int]:
    """ExLlamaV3 1.4.6's rule, written out one swap at a time: the tail k router ids start on the CPU; every
    selection counts; every `interval` steps the layers take turns: while the sweep has swaps left, swap the
    layer's hottest CPU expert (ties: the highest id) with its coldest GPU expert (ties: the lowest id) while
    hot >= max(hysteresis x max(cold, 1), floor x mean count); a layer's counts halve after its turn, and the
    layers after the sweep's last swap get no turn (their counts are not halved either)."""
    steps, layers, _ = routes.shape
    on_cpu = [set(range(experts - k, experts)) for _ in range(layers)]
    counts = [[0.0] * experts for _ in range(layers)]
    hits: list[int] = []
    swaps = 0
    for step in range(steps):
        hit = 0
        for layer in range(layers):
            for expert in (int(e) for e in routes[step, layer]):
                hit += expert in on_cpu[layer]
                counts[layer][expert] += 1.0
        hits.append(hit)
        if (step + 1) % interval:
            continue
        left = max_swaps
        for layer in range(layers):
            if left == 0:
                break
            c = counts[layer]
            mean = sum(c) / experts
            while left > 0:
                hot = max(on_cpu[layer], key=lambda e: (c[e], e))
                cold = min((e for e in range(experts) if e not in on_cpu[layer]), key=lambda e: (c[e], e))
                if c[hot] < max(hysteresis * max(c[cold], 1.0), floor * mean):
                    break
                on_cpu[layer] ^= {hot, cold}
                left -= 1
                swaps += 1
            counts[layer] = [value / 2 for value in c]
    return hits, swaps


def dynamic_cpu_selections(
    routes: NDArray[np.int16], experts: int, k: int, **settings: float
) -> tuple[NDArray[np.int64], int]:
    """`policies.exl3_dynamic` from the tail-k start, its queue draining after every step: per step the
    selections computed on the CPU, and the swaps made."""
    _, layers, top_k = routes.shape
    replayed = exl3_dynamic(routes, experts, [k] * layers, generation=None, **settings)  # type: ignore[arg-type]
    return layers * top_k - replayed.hits.sum(axis=1, dtype=np.int64), replayed.swaps_between(0)


def skewed_routes(steps: int, layers: int, experts: int, top_k: int, seed: int) -> NDArray[np.int16]:
    """Random top-k routing whose hottest experts start in the CPU tail (highest ids), so swaps are due."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, experts + 1) ** 1.3
    routes = np.empty((steps, layers, top_k), dtype=np.int16)
    for layer in range(layers):
        rest = rng.permutation(experts - 2)
        order = np.concatenate(([experts - 1, experts - 2], rest))  # the two hottest start in the CPU tail
        probabilities = np.empty(experts)
        probabilities[order] = weights / weights.sum()
        for step in range(steps):
            routes[step, layer] = rng.choice(experts, top_k, replace=False, p=probabilities)
    return routes


@pytest.mark.parametrize(
    ("max_swaps", "interval", "floor"),
    [(64, 16, 8.0), (3, 16, 8.0), (2, 8, 2.0)],  # the budget binding (3, 2) makes layers lose their turn
)
def test_dynamic_placement_matches_the_rule_written_out(max_swaps: int, interval: int, floor: float) -> None:
    experts, top_k, k = 32, 2, 12
    routes = skewed_routes(steps=320, layers=4, experts=experts, top_k=top_k, seed=max_swaps)
    hits, swaps = dynamic_cpu_selections(
        routes, experts, k, interval=interval, hysteresis=2.0, floor=floor, max_swaps=max_swaps
    )
    want_hits, want_swaps = reference_dynamic(routes, experts, k, interval, 2.0, floor, max_swaps)
    assert swaps == want_swaps and swaps > 0
    assert hits.tolist() == want_hits


def test_the_floor_forbids_every_swap_when_top_k_is_an_eighth_of_the_experts_or_more() -> None:
    """E = 16, top-8 (the repository's ExLlamaV3 fixture): an expert's count is at most the (decayed) number of
    steps W, the floor is 8 x (8 / 16) x W = 4 W: no CPU expert ever clears it, however skewed the routing.
    With GLM-5.3's 288 experts the floor is 8 x 8 / 288 W = 0.22 W: an expert picked in over a fifth of the
    steps can move."""
    routes = skewed_routes(steps=1024, layers=3, experts=16, top_k=8, seed=7)
    hits, swaps = dynamic_cpu_selections(routes, 16, 8)
    assert swaps == 0
    assert hits.sum() == np.isin(routes, np.arange(8, 16)).sum()  # the start placement, never changed
    # The floor is the reason: without it the same routing swaps.
    assert dynamic_cpu_selections(routes, 16, 8, floor=0.0)[1] > 0
    glm = skewed_routes(steps=1024, layers=2, experts=288, top_k=8, seed=7)
    assert dynamic_cpu_selections(glm, 288, 200)[1] > 0


def glm_trace(shifts: tuple[tuple[float, float], ...] = (), steps: int = 6000) -> RoutingTrace:
    spec = SyntheticTraceSpec(layers=(3, 4, 5, 6), steps=steps, skew_min=1.0, skew_max=1.2, shifts=shifts, seed=1)
    return synthesize_trace(spec)


def test_static_placement_wins_on_a_stationary_trace() -> None:
    result = compare_placements(glm_trace(), 200)
    assert result.winner == "static" and "the recommended setting also weighs drift" in result.verdict
    assert result.static_cpu_share < result.dynamic_cpu_share < result.uniform_cpu_share
    assert result.uniform_cpu_share == round(200 / 288, 4)
    assert result.learn_steps == result.scored_steps == 3000


def test_dynamic_placement_wins_when_popularity_re_permutes_at_the_middle() -> None:
    """Static learned on the first half knows nothing of the second; dynamic follows within a few sweeps."""
    result = compare_placements(glm_trace(shifts=((0.5, 1.0),)), 200)
    assert result.winner == "dynamic" and "follows popularity as it drifts" in result.verdict
    assert result.dynamic_cpu_share <= result.static_cpu_share - 0.1
    assert result.static_cpu_share > result.uniform_cpu_share - 0.05  # the learned ranking is no better than none


def test_static_placement_takes_the_coldest_ties_to_the_higher_ids() -> None:
    # ExLlamaV3 sorts hottest first (stable) and puts the tail on the CPU: of the two 1s, id 2 goes first.
    assert static_cpu_experts([5, 1, 1, 3], 1) == [2]
    assert sorted(static_cpu_experts([5, 1, 1, 3], 2)) == [1, 2]
    assert sorted(static_cpu_experts([0, 0, 0, 0], 2)) == [2, 3]


def test_compare_placements_refuses_a_split_outside_the_experts() -> None:
    with pytest.raises(BadInput, match="choose 1 to 287"):
        compare_placements(glm_trace(steps=100), 288)


# --- the stats file ------------------------------------------------------------------------------------------


def test_split_stats_keys_and_lengths(model: ModelFacts) -> None:
    counts = {layer: [float(e) for e in range(model.n_routed_experts)] for layer in model.moe_layers}
    stats = split_stats(model, counts)
    assert list(stats) == [f"model.language_model.layers.{layer}.mlp" for layer in model.moe_layers]
    assert all(len(row) == 288 for row in stats.values())
    assert stats["model.language_model.layers.3.mlp"][5] == 5.0


def test_split_stats_refuses_counts_of_another_model(model: ModelFacts) -> None:
    with pytest.raises(BadInput, match="layer 3 have 16 experts, the model 288"):
        split_stats(model, {3: [1.0] * 16})
    with pytest.raises(BadInput, match="layer 0, not a MoE layer"):
        split_stats(model, {0: [1.0] * 288})


# --- rigs ----------------------------------------------------------------------------------------------------


def test_load_rig_by_name_and_by_file(tmp_path: Path) -> None:
    recipe = load_rig("recipe-2x3090")
    assert len(recipe.gpus) == 2 and recipe.cores == 32 and recipe.ram_bytes == 128 * GIB
    path = tmp_path / "mine.json"
    path.write_text(recipe.model_copy(update={"name": "mine", "cores": 8}).model_dump_json())
    mine = load_rig(str(path))
    assert (mine.name, mine.cores, mine.gpus) == ("mine", 8, recipe.gpus)


def test_a_bad_rig_file_names_the_field(tmp_path: Path) -> None:
    data = json.loads(load_rig("one-3090").model_dump_json())
    data["gpus"][0]["memory_bytes"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=r"gpus\.0\.memory_bytes"):
        load_rig(str(path))
    data = json.loads(load_rig("one-3090").model_dump_json()) | {"ram_gib": 128}
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="ram_gib"):
        load_rig(str(path))
    with pytest.raises(BadInput, match="no rig named 'nope'"):
        load_rig("nope")


def test_rig_topology_numbers_cpus_like_linux() -> None:
    rig = Rig(
        name="t", gpus=[RigGpu(name="g", memory_bytes=GIB)], ram_bytes=GIB, cores=4, threads_per_core=2, numa_nodes=2
    )
    topology = rig_topology(rig)
    assert topology.allowed_cpus == tuple(range(8))
    for cpu in topology.cpus:
        core = cpu.cpu % 4
        assert cpu.core_id == core and cpu.siblings == (core, core + 4)
        assert cpu.numa_node == core // 2
    assert topology.numa_nodes == {0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}
    assert topology.l3_domains == ((0, 1, 4, 5), (2, 3, 6, 7))


# --- the CLI -------------------------------------------------------------------------------------------------


def test_cli_plans_an_exl3_profile_for_a_rig(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(
        ["plan", "host", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--json"], capsys, monkeypatch
    )
    assert code == 0
    plan = Exl3Plan.model_validate_json(out)
    assert plan == plan_for("exl3-2x3090", "recipe-2x3090")
    code, out, _ = run(["plan", "host", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090"], capsys, monkeypatch)
    assert code == 0
    for text in (
        "GPU ledger",
        "0-23",
        "24-44",
        "experts resident",
        "Host memory ledger",
        "offload: split",
        f"predicted decode: {plan.prediction.tokens_per_s:g} tok/s",
        f"the alternative: offload {plan.alternatives[0].tokens_per_s:g} tok/s",
        "EXL3_MOE_CPU_SPLIT",
    ):
        assert text in out


def test_cli_env_lines_load_as_a_plan_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(["plan", "host", "--profile", "exl3-1gpu", "--rig", "one-3090", "--env"], capsys, monkeypatch)
    assert code == 0
    assert out.splitlines()[:3] == ["GPU_SPLIT=23.16", "CACHE_SIZE=131072", "EXL3_MOE_CPU_SPLIT=253"]


def test_cli_stats_trace_and_out_write_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stationary skewed trace of the whole model: static placement beats the default dynamic one on it, but
    the recommendation weighs the stress scenarios too; plan.env carries the recommended setting and
    `glm53 serve --plan-env` passes every one of its variables to the engine."""
    trace_path = tmp_path / "routing.jsonl"
    write_trace(trace_path, synthesize_trace(SyntheticTraceSpec(steps=600, skew_min=1.0, skew_max=1.2, seed=2)))
    out_dir = tmp_path / "plan"
    args = ["plan", "host", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--stats", str(trace_path)]
    code, out, err = run([*args, "--out", str(out_dir)], capsys, monkeypatch)
    assert code == 0
    assert "placement: static placement puts" in err and "static placement puts" in out
    stats_path = (out_dir / "exl3-split-stats.json").resolve()
    stats = json.loads(stats_path.read_text())
    assert len(stats) == 42 and all(len(row) == 288 for row in stats.values())
    env = dict(line.split("=", 1) for line in (out_dir / "plan.env").read_text().splitlines())
    assert env["EXL3_MOE_CPU_SPLIT"] == "200"
    saved = Exl3Plan.model_validate_json((out_dir / "plan.json").read_text())
    assert saved.placement is not None and saved.placement.winner == "static"
    assert saved.recommendation is not None
    chosen = saved.recommendation.engine("exllamav3")
    recommended = chosen.choice.env(str(stats_path))
    assert recommended and all(env[key] == value for key, value in recommended.items())
    assert all(saved.origins[key].startswith("recommended: ") for key in recommended)
    # never slower than the engine's defaults on the scenarios it was judged on, and the plan says so
    over_stock = chosen.worst_over_stock
    assert over_stock is not None and over_stock >= -TOLERANCE and chosen.scored_steps >= SCORED_STEPS
    assert all(f"{over_stock:+.2%} vs its defaults" in saved.origins[key] for key in recommended)
    assert "stock" in out  # its defaults, beside the choice
    assert saved.split_stats_file == str(stats_path) and saved.env == env
    # With the counts the coldest experts are on the CPU: a smaller CPU share than uniform.
    assert saved.prediction.cpu_share < 200 / 288
    assert saved.prediction.cpu_share_source.startswith("routing statistics")

    from glm53.serve.resolve import ServeRequest, resolve_launch

    launch = resolve_launch(
        ServeRequest(profile="exl3-2x3090", plan_env=out_dir / "plan.env"), need_model=False, environ={}
    )
    assert all(launch.spec.env[key] == value for key, value in recommended.items())
    assert launch.profile.settings["GPU_SPLIT"].value == "23.16,23.16"


def test_cli_counts_file_writes_stats_without_a_placement_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    counts_path = tmp_path / "counts.json"
    write_counts(counts_path, synthesize_trace(SyntheticTraceSpec(steps=200, seed=4)).to_counts())
    out_dir = tmp_path / "plan"
    args = ["plan", "host", "--profile", "exl3-1gpu", "--rig", "one-3090", "--stats", str(counts_path)]
    code, _, err = run([*args, "--out", str(out_dir), "--json"], capsys, monkeypatch)
    assert code == 0 and "placement:" not in err
    assert (out_dir / "exl3-split-stats.json").is_file()
    env = (out_dir / "plan.env").read_text()
    assert "EXL3_MOE_CPU_SWAP" not in env and "EXL3_MOE_CPU_SPLIT_STATS" not in env


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    exl3 = ["plan", "host", "--profile", "exl3-2x3090"]
    code, _, err = run([*exl3, "--rig", "no-such-rig"], capsys, monkeypatch)
    assert code == 2 and "no rig named" in err
    code, _, err = run([*exl3, "--rig", "recipe-2x3090", "--tp", "2"], capsys, monkeypatch)
    assert code == 2 and "--tp: vLLM plan options" in err
    code, _, err = run([*exl3, "--rig", "recipe-2x3090", "--ram", "64GiB"], capsys, monkeypatch)
    assert code == 2 and "--ram: vLLM plan options" in err
    bad_counts = tmp_path / "counts.json"
    write_counts(bad_counts, synthesize_trace(SyntheticTraceSpec(layers=(3,), experts=16, steps=10)).to_counts())
    code, _, err = run([*exl3, "--rig", "recipe-2x3090", "--stats", str(bad_counts)], capsys, monkeypatch)
    assert code == 2 and "16 experts, the model 288" in err
    code, _, err = run([*exl3, "--rig", "one-3090"], capsys, monkeypatch)
    assert code == 1 and "infeasible" in err and "GPUS=1" in err
    code, _, err = run([*exl3, "--max-model-len", str(1 << 21), "--rig", "recipe-2x3090"], capsys, monkeypatch)
    assert code == 2 and "positions" in err

    # No NVIDIA GPU on this host and no --rig: the environment cannot plan it (3).
    import glm53.host.facts as facts
    from glm53.host.gpus import NoGpu

    original = facts.read_host_facts

    def no_gpu() -> list[object]:
        raise NoGpu("no NVIDIA driver")

    monkeypatch.setattr(facts, "read_host_facts", lambda root, **kw: original(root, **{**kw, "gpu_reader": no_gpu}))
    code, _, err = run([*exl3, "--host-root", str(HOSTS / "threadripper-5975wx-cgv2")], capsys, monkeypatch)
    assert code == 3 and "no NVIDIA GPU" in err and "--rig" in err
