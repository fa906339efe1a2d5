"""The GPU expert cache's policy, sizing and planner glue (`glm53.plan.exllamav3.expert_cache`, `plan expert-cache`).

The policy is checked three ways: the lookup kernel's algorithm written out step by step (`replay_lookups`)
equals the planner's vectorised simulator on arbitrary traces, and both equal the hit counts the CUDA kernel
itself reported on an H200 and an H100 (benchmarks/data/expert-cache-h200.json, expert-cache-h100.json, from
tools/exl3-expert-cache-bench.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glm53.errors import BadInput
from glm53.plan.cache.policies import decayed_frequency, pinned_lru_masks, pinned_lru_step_hits
from glm53.plan.exllamav3.expert_cache import check_trace_matches, replay_lookups, size_cache
from glm53.plan.inputs.model import load_architecture
from glm53.plan.routing.spec import SyntheticTraceSpec
from glm53.plan.routing.traces import RoutingTrace, synthesize_trace, write_trace
from tests.support.cli import run_with_capsys as run

MEASURED = Path(__file__).parents[1] / "benchmarks" / "data" / "expert-cache-h200.json"
# The later run: the decayed-frequency policy, ExLlamaV3's static CPU split and the hybrid cache beside LRU.
MEASURED_H100 = MEASURED.with_name("expert-cache-h100.json")
GIB = 2**30


@st.composite
def layer_traces(draw: st.DrawFn) -> tuple[np.ndarray, int, np.ndarray, int, int]:
    experts = draw(st.integers(2, 24))
    top_k = draw(st.integers(1, min(4, experts)))
    steps = draw(st.integers(1, 40))
    rows = [draw(st.permutations(range(experts)))[:top_k] for _ in range(steps)]
    ranking = np.array(draw(st.permutations(range(experts))), dtype=np.int64)
    pinned = draw(st.integers(0, experts))
    window = draw(st.integers(0, experts))
    return np.array(rows, dtype=np.int64), experts, ranking, pinned, window


@settings(max_examples=300, deadline=None)
@given(layer_traces())
def test_the_kernels_algorithm_is_the_planners_simulator(case: tuple[np.ndarray, int, np.ndarray, int, int]) -> None:
    routes, experts, ranking, pinned, window = case
    stepwise = replay_lookups(routes, experts, ranking.tolist(), pinned, window)
    vectorised = pinned_lru_masks(routes, experts, ranking, [(pinned, window)])[0].sum(axis=1)
    assert stepwise.tolist() == vectorised.tolist()


def test_replay_keeps_the_window_most_recent() -> None:
    # window 2, one expert a step: 0 1 2 0 -> 0 was pushed out by 1 and 2; 2 1 hit afterwards.
    routes = np.array([[0], [1], [2], [0], [2], [1]])
    assert replay_lookups(routes, 4, [3, 2, 1, 0], 0, 2).tolist() == [0, 0, 0, 0, 1, 0]
    # the same with expert 0 pinned: it always hits, and does not take a window slot
    ranking = [0, 1, 2, 3]
    assert replay_lookups(routes, 4, ranking, 1, 2).tolist() == [1, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    ("measured", "runs_checked"),
    [
        (MEASURED, 15),
        (MEASURED_H100, 25),
        (MEASURED_H100.with_name("expert-cache-h100-14-threads.json"), 25),
        (MEASURED_H100.with_name("expert-cache-h100-api3.json"), 25),  # the module with api 3's table order
        # the short half-lives glm53 plan expert-cache may choose (no CPU modes)
        (MEASURED_H100.with_name("expert-cache-h100-half-life-16.json"), 21),
        (MEASURED_H100.with_name("expert-cache-h100-half-life-32.json"), 21),
    ],
)
def test_the_gpus_hit_counts_equal_both_replays(measured: Path, runs_checked: int) -> None:
    """The GPU run's per-layer hits (the kernel's own counters) for every cache setting it ran."""
    report = json.loads(measured.read_text())
    args = report["args"]
    warm = 32  # the bench's warm-up steps before the measured ones
    trace = synthesize_trace(
        SyntheticTraceSpec(
            layers=tuple(range(args["layers"])),
            experts=args["experts"],
            top_k=args["top_k"],
            steps=warm + args["steps"],
            locality=args["locality"],
            seed=args["seed"],
        )
    )
    rankings = np.argsort(-trace.counts(), axis=1, kind="stable")
    routes = trace.routes[warm:].astype(np.int64)
    layers = args["layers"]
    checked = 0
    for label, run_ in report["runs"].items():
        if "hits" not in run_:
            continue
        pinned, window = run_["pinned"], run_["window"]
        if run_.get("policy") == "frequency":
            simulated = decayed_frequency(
                routes, trace.experts, [window], recent=args["recent"], half_life=args["half_life"]
            )
            assert simulated.hits.sum(axis=0).tolist() == run_["hits"], label
        else:
            simulated = pinned_lru_step_hits(routes, trace.experts, rankings, [pinned] * layers, [window] * layers)
            assert simulated.hits.sum(axis=0).tolist() == run_["hits"], label
            stepwise = [
                int(replay_lookups(routes[:, i, :], trace.experts, rankings[i].tolist(), pinned, window).sum())
                for i in range(layers)
            ]
            assert stepwise == run_["hits"], label
        if label.startswith("hybrid-"):
            # misses computed on the CPU: not exact, held by the KL gate instead
            assert run_["kl_gate"] and run_["kl_mean"] <= args["max_kl"], label
            assert run_["cpu_share"] == pytest.approx(1 - run_["hit_rate"]), label
        else:
            assert run_["exact"], label  # bit-equal to the all-resident model
            assert set(run_["overflow"]) == {0}, label
            assert [h + m for h, m in zip(run_["hits"], run_["misses"], strict=True)] == [args["steps"] * 8] * layers
        checked += 1
    # 2 budgets x (LRU, pinned LRU[, frequency]) + streaming, eager, graph and paced each[, hybrid eager and paced]
    assert checked == runs_checked


def test_the_static_split_computes_on_the_cpu_what_its_gpu_share_does_not_hold() -> None:
    """ExLlamaV3's static split as the H100 ran it: the `slots + top_k` hottest experts of a layer on the GPU, the
    rest on the CPU; its CPU share is the trace's share outside that set, and it passed the KL gate."""
    report = json.loads(MEASURED_H100.read_text())
    args = report["args"]
    warm = 32
    trace = synthesize_trace(
        SyntheticTraceSpec(
            layers=tuple(range(args["layers"])), experts=args["experts"], top_k=args["top_k"],
            steps=warm + args["steps"], locality=args["locality"], seed=args["seed"],
        )
    )  # fmt: skip
    rankings = np.argsort(-trace.counts(), axis=1, kind="stable")
    routes = trace.routes[warm:]
    splits = {label: run_ for label, run_ in report["runs"].items() if label.startswith("split-")}
    assert sorted(splits) == ["split-144/eager", "split-64/eager"]
    for label, run_ in splits.items():
        held = run_["gpu_experts"]
        on_gpu = sum(np.isin(routes[:, i, :], rankings[i][:held]).sum() for i in range(args["layers"]))
        assert run_["cpu_share"] == pytest.approx(1 - on_gpu / routes.size), label
        assert run_["kl_gate"] and not run_["exact"], label


def test_size_fits_the_budget_beside_staging() -> None:
    facts = load_architecture()
    size = size_cache(facts, 14 * GIB, gpus=2, pinned_fraction=0.2)
    assert (size.layers_per_gpu, size.staging) == (21, 8)
    assert size.used_bytes_per_gpu <= 14 * GIB < size.used_bytes_per_gpu + 21 * facts.expert_bytes
    assert size.pinned == round(0.2 * size.slots) and size.window == size.slots - size.pinned
    assert size.engine_args == {"pinned": size.pinned, "window": size.window, "slots": size.slots + 8}
    assert size.host_pool_bytes == 42 * 288 * facts.expert_bytes
    # a batch of 4 sequences stages 32 misses a step, so fewer resident slots
    assert size_cache(facts, 14 * GIB, gpus=2, sequences=4).slots == size.slots - 24
    # more memory than every expert: all of them, no more
    assert size_cache(facts, 200 * GIB, gpus=1).slots == 288


def test_slots_that_do_not_fit_name_the_flag_and_the_minimum() -> None:
    with pytest.raises(BadInput, match=r"--cache-memory 1.00 GiB does not fit the cache") as error:
        size_cache(load_architecture(), GIB, gpus=2)
    assert error.value.fix is not None and "at least 2GiB" in error.value.fix


@pytest.mark.parametrize("share", [1.5, -0.1, math.nan, math.inf])
def test_a_pinned_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(BadInput, match=r"--pinned-fraction .* is not a share of the slots"):
        size_cache(load_architecture(), 14 * GIB, gpus=2, pinned_fraction=share)


def test_a_capture_of_another_model_is_refused() -> None:
    facts = load_architecture()
    other = RoutingTrace((0, 1), 64, 6, np.zeros((4, 2, 6), dtype=np.int16))
    with pytest.raises(BadInput, match=r"not a routing capture of GLM-5\.3") as error:
        check_trace_matches(other, facts, source="mixtral.npz")
    for part in ("64 experts a layer, the model has 288", "top-6 routing", "layers [0, 1]"):
        assert part in str(error.value)


def test_cli_sizes_and_chooses_with_the_lru_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = synthesize_trace(SyntheticTraceSpec(steps=3000, layers=tuple(range(3, 15)), seed=3))
    path = tmp_path / "routing.npz"
    write_trace(path, trace)
    code, out, _ = run(["plan", "expert-cache", str(path), "--cache-memory", "14GiB", "--json"], capsys, monkeypatch)
    assert code == 0
    plan = json.loads(out)
    choice = plan["choice"]
    assert choice["pinned_fraction"] in (0.0, 0.1, 0.2, 0.4, 0.6)
    assert plan["size"]["pinned"] == round(choice["pinned_fraction"] * plan["size"]["slots"])
    # never more than a quarter point below plain LRU on any scenario
    assert all(h >= lru - 0.0025 for h, lru in zip(choice["hit_rates"], choice["lru_hit_rates"], strict=True))
    assert plan["engine_args"]["slots"] == plan["size"]["slots"] + 8
    code, out, _ = run(["plan", "expert-cache", "--cache-memory", "14GiB"], capsys, monkeypatch)
    assert code == 0 and "lookup kernel per layer: pinned=13, window=54, slots=75" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-memory", "1GiB"], "does not fit the cache"),
        (["--cache-memory", "14GiB", "--pinned-fraction", "1.5"], "is not a share of the slots"),
        (["--cache-memory", "14GiB", "--pinned-fraction", "most"], "--pinned-fraction 'most' is not a number"),
        (["--cache-memory", "lots"], "--cache-memory"),
        ([], "--cache-memory is required"),
    ],
)
def test_cli_bad_values_exit_2_with_the_fix(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(["plan", "expert-cache", *args], capsys, monkeypatch)
    assert code == 2
    assert message in err


def test_cli_refuses_a_capture_of_another_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mixtral.npz"
    write_trace(path, synthesize_trace(SyntheticTraceSpec(steps=50, layers=(0, 1), experts=8, top_k=2)))
    code, _, err = run(["plan", "expert-cache", str(path), "--cache-memory", "14GiB"], capsys, monkeypatch)
    assert code == 2
    assert "is not a routing capture of" in err and "8 experts a layer" in err


def test_the_host_resident_run_says_what_the_docs_say() -> None:
    """The H100 run of host-resident experts (benchmarks/data/expert-cache-host-h100.json, from
    tools/exl3-host-experts-check.py and a served run): the VRAM each load took, the decode passes that matched the
    stock engine in each arrangement, and the served hits, as docs/serve.md reports them."""
    run = json.loads(MEASURED.with_name("expert-cache-host-h100.json").read_text())
    check = run["check"]
    stock_mib, host_mib = (check[side]["allocated_bytes"] / 2**20 for side in ("stock", "host"))
    assert (f"{stock_mib:.1f}", f"{host_mib:.1f}") == ("192.1", "12.5")
    assert check["host"]["host_layers"] == 5 and check["host"]["arena_bytes"] * 5 == check["host"]["host_pool_bytes"]
    matched = {
        name: (check[name]["one_row_equal"], check[name]["one_row_repeating"])
        for name in ("gpu_cache", "host_cache", "host_cache_staged")
    }
    assert matched == {"gpu_cache": (230, 230), "host_cache": (46, 230), "host_cache_staged": (230, 230)}
    served = run["serve"]["cache_check"]["layers"]
    assert all(layer["engine_hits"] == layer["simulated_hits"] for layer in served) and len(served) == 5
    assert all(r["valid"] for r in run["serve"]["bench"])
    docs = (Path(__file__).parents[1] / "docs" / "serve.md").read_text()
    assert "192.1 MiB of GPU memory stock and **12.5 MiB**" in docs and "only 46 of 230 did" in docs


def test_the_api_3_module_computes_every_decode_pass_from_its_slot() -> None:
    """The same check and serves with the api-3 module (benchmarks/data/expert-cache-host-h100-api3.json): every
    one-token pass the stock layers repeat is bit-equal in all three arrangements, host-resident included, every
    prefill pass is within the stock engine's own run-to-run difference, and both serves' hits equal the
    simulator's."""
    run = json.loads(MEASURED.with_name("expert-cache-host-h100-api3.json").read_text())
    assert "api 3" in run["module"]
    check = run["check"]
    for name in ("gpu_cache", "host_cache", "host_cache_staged"):
        assert (check[name]["one_row_equal"], check[name]["one_row_repeating"]) == (230, 230), name
    assert check["equal_where_stock_repeats"] and check["multi_row_within_stock_noise"]
    several = [p for p in run["check_passes"] if p["rows"] > 1]
    assert len(several) == 8 and max(p["max_abs_difference"] for p in several) <= check["stock_multi_row_noise"]
    assert check["host"]["allocated_bytes"] < check["stock"]["allocated_bytes"] / 10
    for side in ("serve", "serve_gpu"):
        layers = run[side]["cache_check"]["layers"]
        engine = run[side]["cache_report"]["layers"]
        assert [layer["engine_hits"] for layer in layers] == [
            engine[f"model.language_model.layers.{layer['layer']}.mlp"]["hits"] for layer in layers
        ], side
        assert all(layer["engine_hits"] == layer["simulated_hits"] for layer in layers) and len(layers) == 5
        assert all(r["valid"] for r in run[side]["bench"]) and len(run[side]["bench"]) == 2
    docs = (Path(__file__).parents[1] / "docs" / "serve.md").read_text()
    assert "all 230 in each of the three arrangements" in docs and "5,532 of 7,720" in docs
