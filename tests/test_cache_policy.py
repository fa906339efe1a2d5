"""The GPU expert cache's policy code against glm53's simulator, without a GPU.

The lookup kernel takes its every decision from pkgs/exllamav3/expert-cache/policy.cuh; the same file built for
the host (tests/support/cache_policy_replay.cpp, with this machine's g++, from the project's package list) steps
traces exactly as the kernel does. Its hits per step must equal the simulator's that `glm53 plan` and
`glm53 plan expert-cache-check` use: `pinned_lru_step_hits` for LRU with pinned slots, `decayed_frequency` for
the frequency policy. On the GPU the kernel's counts were checked against the same simulator (docs/serve.md).
The replay also keeps the pointer tables as the kernel does (return_home, point_at_slot) and checks that every
selection is computed from a slot that holds its expert."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glm53.errors import BadInput
from glm53.plan.cache.policies import decayed_frequency, growth_rate, pinned_lru_step_hits
from glm53.plan.exllamav3.expert_cache import check_cache_report
from glm53.plan.routing.spec import SyntheticTraceSpec
from glm53.plan.routing.traces import RoutingTrace, synthesize_trace, write_trace
from tests.support.cli import run_glm53

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "pkgs" / "exllamav3" / "expert-cache"
REPLAY = ROOT / "tests" / "support" / "cache_policy_replay.cpp"
LRU, FREQUENCY = 0, 1  # policy.cuh's POLICY_LRU, POLICY_FREQUENCY


@pytest.fixture(scope="module")
def replay_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ (build-essential, in the project's package list)")
    program = tmp_path_factory.mktemp("policy") / "cache_policy_replay"
    # -ffp-contract=off: no fused multiply-add, as in the simulator's numpy and numba
    argv = [compiler, "-O2", "-std=c++17", "-Wall", "-Werror", "-ffp-contract=off", f"-I{POLICY}", str(REPLAY)]
    subprocess.run([*argv, "-o", str(program)], check=True)
    return program


def _replay(
    program: Path,
    routes: np.ndarray,
    experts: int,
    policy: int,
    window: int,
    *,
    pinned: int = 0,
    recent: int = 1,
    half_life: float = 256.0,
    rankings: np.ndarray | None = None,
    work: Path,
) -> tuple[np.ndarray, list[int]]:
    """(hits per step and layer, overflow per layer) of the policy code stepping `routes`."""
    steps, layers, top_k = routes.shape
    routes_file = work / "routes.bin"
    routes.astype("<i8").tofile(routes_file)
    rate = growth_rate(half_life)  # as decayed_frequency computes it, and the engine's runner
    argv = [str(program), str(routes_file), str(steps), str(layers), str(top_k), str(experts), str(policy)]
    argv += [str(pinned), str(window), str(recent), repr(rate)]
    if rankings is not None:
        rankings_file = work / "rankings.bin"
        rankings.astype("<i8").tofile(rankings_file)
        argv.append(str(rankings_file))
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    rows = [list(map(int, line.split())) for line in done.stdout.splitlines()]
    assert len(rows) == layers
    return np.array([row[1:] for row in rows]).T, [row[0] for row in rows]


def _trace(seed: int, experts: int = 288, top_k: int = 8, steps: int = 1500, **kwargs: object) -> np.ndarray:
    spec = SyntheticTraceSpec(layers=(3, 4, 5), experts=experts, top_k=top_k, steps=steps, seed=seed, **kwargs)
    return synthesize_trace(spec).routes.astype(np.int64)


@pytest.mark.parametrize("window", [8, 40, 80, 200])
@pytest.mark.parametrize("kind", ["stationary", "drifting"])
def test_lru_hits_equal_the_simulators_step_by_step(
    replay_program: Path, tmp_path: Path, window: int, kind: str
) -> None:
    routes = _trace(7, shifts=((0.5, 0.6),)) if kind == "drifting" else _trace(3)
    hits, overflow = _replay(replay_program, routes, 288, LRU, window, work=tmp_path)
    ranking = np.tile(np.arange(288, dtype=np.int64), (3, 1))
    expected = pinned_lru_step_hits(routes, 288, ranking, [0] * 3, [window] * 3).hits
    assert overflow == [0, 0, 0]
    np.testing.assert_array_equal(hits, expected)
    assert 0 < hits.sum() < routes.size  # the trace exercises both hits and misses


@pytest.mark.parametrize(("pinned", "window"), [(20, 40), (58, 22), (100, 8)])
def test_pinned_lru_hits_equal_the_simulators(replay_program: Path, tmp_path: Path, pinned: int, window: int) -> None:
    routes = _trace(11, skew_min=0.8, skew_max=1.4)
    counts = np.stack([np.bincount(routes[:, layer, :].ravel(), minlength=288) for layer in range(3)])
    rankings = np.argsort(-counts, axis=1, kind="stable").astype(np.int64)
    hits, overflow = _replay(replay_program, routes, 288, LRU, window, pinned=pinned, rankings=rankings, work=tmp_path)
    expected = pinned_lru_step_hits(routes, 288, rankings, [pinned] * 3, [window] * 3).hits
    assert overflow == [0, 0, 0]
    np.testing.assert_array_equal(hits, expected)


@pytest.mark.parametrize(("window", "recent", "half_life"), [(80, 1, 256.0), (40, 4, 32.0), (120, 0, 1e9)])
@pytest.mark.parametrize("kind", ["stationary", "drifting"])
def test_frequency_hits_equal_the_simulators_step_by_step(
    replay_program: Path, tmp_path: Path, window: int, recent: int, half_life: float, kind: str
) -> None:
    routes = _trace(5, shifts=((0.4, 0.8),)) if kind == "drifting" else _trace(9)
    hits, overflow = _replay(
        replay_program, routes, 288, FREQUENCY, window, recent=recent, half_life=half_life, work=tmp_path
    )
    for loop in (False, True):  # the simulator's numpy rule, and its loop (numba where installed)
        expected = decayed_frequency(routes, 288, [window], recent=recent, half_life=half_life, loop=loop).hits
        np.testing.assert_array_equal(hits, expected)
    assert overflow == [0, 0, 0]


def test_frequency_renormalises_its_counts_as_the_simulator_does(replay_program: Path, tmp_path: Path) -> None:
    """A half-life of a quarter step multiplies the growth by 16 a step: past 1e150 within 125 steps, so the
    counts are renormalised several times in 1,500 steps."""
    routes = _trace(13, experts=64, top_k=4)
    hits, _ = _replay(replay_program, routes, 64, FREQUENCY, 16, recent=2, half_life=0.25, work=tmp_path)
    np.testing.assert_array_equal(hits, decayed_frequency(routes, 64, [16], recent=2, half_life=0.25).hits)


def test_the_engines_own_routing_replays_alike(replay_program: Path, tmp_path: Path) -> None:
    """Routing ExLlamaV3 recorded while TabbyAPI served the tiny fixture (16 experts, top-8; the capture of
    tests/fixtures/exl3-capture, layers 3 to 6 over the same 5,734 steps)."""
    with np.load(ROOT / "tests" / "fixtures" / "exl3-capture" / "served-sweeps.npz") as capture:
        routes = np.stack([capture[f"routes_{layer}"] for layer in (3, 4, 5, 6)], axis=1).astype(np.int64)
    experts = 16
    ranking = np.tile(np.arange(experts, dtype=np.int64), (routes.shape[1], 1))
    for window in (2, 4, 7):
        hits, overflow = _replay(replay_program, routes, experts, LRU, window, work=tmp_path)
        np.testing.assert_array_equal(hits, pinned_lru_step_hits(routes, experts, ranking, [0] * 4, [window] * 4).hits)
        assert set(overflow) == {0}
        hits, overflow = _replay(replay_program, routes, experts, FREQUENCY, window, recent=1, work=tmp_path)
        np.testing.assert_array_equal(hits, decayed_frequency(routes, experts, [window]).hits)
        assert set(overflow) == {0}


@settings(max_examples=60, deadline=None)
@given(
    experts=st.integers(2, 24),
    top_k=st.integers(1, 4),
    steps=st.integers(2, 120),
    window_share=st.floats(0.0, 1.0),
    recent=st.integers(0, 3),
    half_life=st.sampled_from([0.5, 1.0, 3.0, 64.0]),
    seed=st.integers(0, 2**16),
)
def test_any_small_trace_replays_alike_in_both_policies(
    replay_program: Path,
    tmp_path_factory: pytest.TempPathFactory,
    experts: int,
    top_k: int,
    steps: int,
    window_share: float,
    recent: int,
    half_life: float,
    seed: int,
) -> None:
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    # distinct experts per row, skewed so that some come back
    weights = rng.dirichlet(np.full(experts, 0.3))
    keys = rng.standard_exponential((steps, 1, experts)) / np.maximum(weights, 1e-12)
    routes = np.argsort(keys, axis=2)[:, :, :top_k].astype(np.int64)
    window = max(1, round(window_share * experts))
    work = tmp_path_factory.mktemp("small")
    ranking = np.arange(experts, dtype=np.int64)[None, :]
    lru, _ = _replay(replay_program, routes, experts, LRU, window, work=work)
    np.testing.assert_array_equal(lru, pinned_lru_step_hits(routes, experts, ranking, [0], [window]).hits)
    frequency, _ = _replay(
        replay_program, routes, experts, FREQUENCY, window, recent=recent, half_life=half_life, work=work
    )
    expected = decayed_frequency(routes, experts, [window], recent=recent, half_life=half_life, loop=False).hits
    np.testing.assert_array_equal(frequency, expected)


@pytest.mark.parametrize("policy", ["lru", "frequency"])
def test_the_serve_check_accepts_what_the_policy_code_counts(replay_program: Path, tmp_path: Path, policy: str) -> None:
    """`glm53 plan expert-cache-check` on a report whose counts the kernel's policy code made: equal, for either
    policy; the same counts under the other policy's name are not."""
    routes = _trace(21, steps=800)
    trace = RoutingTrace((3, 4, 5), 288, 8, routes.astype(np.int16))
    code = FREQUENCY if policy == "frequency" else LRU
    hits, overflow = _replay(replay_program, routes, 288, code, 60, recent=2, half_life=64.0, work=tmp_path)
    layers = {
        f"model.language_model.layers.{layer}.mlp": {
            "hits": int(hits[:, i].sum()),
            "misses": int(routes.shape[0] * 8 - hits[:, i].sum()),
            "overflow": overflow[i],
        }
        for i, layer in enumerate(trace.layers)
    }
    report = {"window": 60, "pinned": 0, "policy": policy, "recent": 2, "half_life": 64.0, "layers": layers}
    check = check_cache_report(report, trace)
    assert check.equal and check.policy == policy, check
    # the command, as a user runs it on a serve's report and capture
    (tmp_path / "expert-cache.json").write_text(json.dumps(report))
    write_trace(tmp_path / "routing.npz", trace)
    result = run_glm53("plan", "expert-cache-check", str(tmp_path / "expert-cache.json"), str(tmp_path / "routing.npz"))
    assert result.code == 0, result.stderr
    assert ("60 frequency slots" if policy == "frequency" else "0 pinned + 60 LRU slots") in result.stdout
    assert "equal on every layer" in result.stdout
    other = {**report, "policy": "lru" if policy == "frequency" else "frequency"}
    assert not check_cache_report(other, trace).equal
    with pytest.raises(BadInput, match="not an expert-cache report"):
        check_cache_report({**report, "policy": "lfu"}, trace)


def _table_errors(
    program: Path,
    routes: np.ndarray,
    experts: int,
    policy: int,
    window: int,
    work: Path,
    *,
    pinned: int = 0,
    rankings: np.ndarray | None = None,
    home_in_step: bool = False,
) -> int:
    """Entries of the replayed pointer tables that name neither a slot holding their expert (where the engine's
    kernels read them) nor, between steps, the expert's home copy (cache_policy_replay.cpp's check)."""
    steps, layers, top_k = routes.shape
    routes_file = work / "routes.bin"
    routes.astype("<i8").tofile(routes_file)
    argv = [str(program), str(routes_file), str(steps), str(layers), str(top_k), str(experts), str(policy)]
    argv += [str(pinned), str(window), "1", repr(growth_rate(256.0))]
    if rankings is not None:
        rankings_file = work / "rankings.bin"
        rankings.astype("<i8").tofile(rankings_file)
        argv.append(str(rankings_file))
    env = {**os.environ, "REPLAY_HOME_IN_STEP": "1" if home_in_step else "0"}
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("table_errors ")]
    return int(line.split()[1])


@pytest.mark.parametrize(
    ("policy", "window", "pinned"),
    [(LRU, 4, 0), (LRU, 6, 0), (LRU, 40, 0), (LRU, 20, 8), (FREQUENCY, 4, 0), (FREQUENCY, 40, 0)],
)
def test_every_selection_is_computed_from_a_slot_that_holds_it(
    replay_program: Path, tmp_path: Path, policy: int, window: int, pinned: int
) -> None:
    """The kernel's table updates (policy.cuh's return_home and point_at_slot, in the kernel's order): after each
    lookup every selected expert's gate, up and down entries name a slot holding its bytes, also when the window
    is smaller than a step's selections and the expert leaves in the step that computes it; between steps every
    entry names such a slot or the expert's home copy, which prefill reads."""
    routes = _trace(3, experts=64, steps=400)
    rankings = np.stack([np.argsort(-np.bincount(routes[:, i].ravel(), minlength=64), kind="stable") for i in range(3)])
    errors = _table_errors(replay_program, routes, 64, policy, window, tmp_path, pinned=pinned, rankings=rankings)
    assert errors == 0


def test_returning_a_freed_expert_home_in_its_own_step_is_caught(replay_program: Path, tmp_path: Path) -> None:
    """The order the kernel had before api 3: a window of 4 frees 4 of a step's 8 selections before they run, and
    their entries named the home copy (in a host-resident engine, another layer's experts in the staging arena).
    The check counts each of them, every step and layer; a window of at least a step's selections never frees one."""
    routes = _trace(3, experts=64, steps=400)
    steps, layers, _ = routes.shape
    assert _table_errors(replay_program, routes, 64, LRU, 4, tmp_path, home_in_step=True) == steps * layers * 4
    assert _table_errors(replay_program, routes, 64, LRU, 40, tmp_path, home_in_step=True) == 0
