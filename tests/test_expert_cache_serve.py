"""The GPU expert cache from the planner to the engine's process: `glm53 serve` with EXPERT_CACHE=1 (the launch
wrapped in `glm53.serve.engines.exllamav3.expert_cache`, bad settings refused before a start), `glm53 plan host
--expert-cache` (slots sized from the GPU budget, the pinned share from a trace), `glm53 plan expert-cache-check`
(the engine's report against the simulator) and the runner itself in a real child process.

ExLlamaV3 and the cache's CUDA extension are not here: the hooks inside the engine are held to the GPU in
tests/test_expert_cache.py (the H200 run). Every glm53 piece below runs for real.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glm53.errors import BadInput
from glm53.plan.cache.policies import pinned_lru_step_hits
from glm53.plan.exllamav3.expert_cache import check_cache_report, replay_lookups, size_cache
from glm53.plan.inputs.model import model_facts
from glm53.plan.routing.spec import SyntheticTraceSpec
from glm53.plan.routing.traces import RoutingTrace, synthesize_trace, write_trace
from glm53.serve.engines.exllamav3.expert_cache import EXTENSION_MARKER as EXPERT_CACHE_MARKER
from glm53.serve.engines.exllamav3.expert_cache import REPORT_NAME, CacheSettings, cache_settings, read_rankings
from tests.support.cli import CliResult, run_glm53
from tests.support.fake_nvml import FakeNvml

RUNNER = "glm53.serve.engines.exllamav3.expert_cache"
SOURCE = Path(__file__).parents[1] / "python" / "src"
STAND_IN = Path(__file__).parent / "fixtures" / "exl3-standin"
TABBY_MAIN = "$GLM53_TABBYAPI_DIR/main.py"  # no TabbyAPI tree named: the dry run shows the placeholder
KEY = "model.language_model.layers.{}.mlp"  # ExLlamaV3's module key of a GLM-5.3 MoE layer
CACHE_KEYS = (
    "EXPERT_CACHE",
    "EXPERT_CACHE_WINDOW",
    "EXPERT_CACHE_PINNED",
    "EXPERT_CACHE_STATS",
    "EXPERT_CACHE_POLICY",
    "EXPERT_CACHE_RECENT",
    "EXPERT_CACHE_HALF_LIFE",
)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No GPU on this machine, and the engine's run directory under a private runtime folder."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error="Driver Not Loaded"))
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime / "glm53-tabby-8000"


def _sets(**values: str) -> list[str]:
    return [word for key, value in values.items() for word in ("--set", f"{key}={value}")]


def _dry_run(*args: str, profile: str = "exl3-1gpu") -> dict[str, Any]:
    result = run_glm53("serve", "--profile", profile, "--dry-run", "--json", *args)
    assert result.code == 0, result.stderr
    shown: dict[str, Any] = result.json()
    return shown


def _env_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


# ---------------------------------------------------------------- glm53 serve: the launch


def test_dry_run_wraps_tabbyapi_in_the_cache_runner(run_dir: Path) -> None:
    shown = _dry_run(*_sets(EXPERT_CACHE="1", EXPERT_CACHE_WINDOW="4", EXPERT_CACHE_PINNED="0"))
    launch = shown["launch"]
    assert launch["argv"] == [
        sys.executable,
        "-m",
        RUNNER,
        "--report",
        f"{run_dir}/{REPORT_NAME}",
        TABBY_MAIN,
        "--config",
        f"{run_dir}/config.yml",
    ]
    assert REPORT_NAME == "expert-cache.json"
    assert launch["origins"]["argv"].endswith("; EXPERT_CACHE=1")
    for key, value in (("EXPERT_CACHE", "1"), ("EXPERT_CACHE_WINDOW", "4"), ("EXPERT_CACHE_PINNED", "0")):
        assert shown["values"][key] == {"value": value, "origin": "set", "source": "--set"}
        assert launch["origins"][key] == "--set"
        assert launch["env"][key] == value  # what the runner reads in TabbyAPI's process

    human = run_glm53("serve", "--profile", "exl3-1gpu", "--dry-run", *_sets(EXPERT_CACHE="1", EXPERT_CACHE_WINDOW="4"))
    assert human.code == 0, human.stderr
    assert f"-m {RUNNER}" in human.stdout and f"--report {run_dir}/{REPORT_NAME}" in human.stdout
    assert "EXPERT_CACHE_WINDOW=4  # --set" in human.stdout


def test_a_routing_capture_runs_inside_the_cache_runner(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shown = _dry_run("--capture-routing", "capture", *_sets(EXPERT_CACHE="1", EXPERT_CACHE_WINDOW="4"))
    argv = shown["launch"]["argv"]
    # one runner records and caches: the capture's directory made absolute (TabbyAPI starts in its run directory)
    assert argv[1:7] == ["-m", RUNNER, "--report", f"{run_dir}/{REPORT_NAME}", "--capture", str(tmp_path / "capture")]
    assert argv[7:] == [TABBY_MAIN, "--config", f"{run_dir}/config.yml"]
    assert "glm53.serve.engines.exllamav3.routing" not in argv
    # without the cache, the recorder alone
    plain = _dry_run("--capture-routing", "capture")["launch"]["argv"]
    assert plain[1:5] == ["-m", "glm53.serve.engines.exllamav3.routing", "--out", str(tmp_path / "capture")]


@pytest.mark.parametrize("sets", [{}, {"EXPERT_CACHE": "0", "EXPERT_CACHE_WINDOW": "4"}, {"EXPERT_CACHE": ""}])
def test_without_the_cache_the_argv_is_tabbyapis_own(run_dir: Path, sets: dict[str, str]) -> None:
    launch = _dry_run(*_sets(**sets))["launch"]
    assert launch["argv"] == [sys.executable, TABBY_MAIN, "--config", f"{run_dir}/config.yml"]
    assert "EXPERT_CACHE=1" not in launch["origins"]["argv"]


def test_a_relative_stats_file_reaches_the_engine_absolute(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("counts.json").write_text(json.dumps({KEY.format(3): [5, 1, 9, 0]}))
    sets = _sets(EXPERT_CACHE="1", EXPERT_CACHE_WINDOW="2", EXPERT_CACHE_PINNED="1", EXPERT_CACHE_STATS="counts.json")
    shown = _dry_run(*sets)
    assert shown["launch"]["argv"][2] == RUNNER
    assert shown["launch"]["env"]["EXPERT_CACHE_STATS"] == str(tmp_path / "counts.json")
    for key in CACHE_KEYS[:4]:  # the keys set here
        assert shown["values"][key]["source"] == "--set" and shown["launch"]["origins"][key] == "--set"


def test_the_rigs_plan_sizes_the_window_and_a_set_value_wins(run_dir: Path) -> None:
    rig = ("--rig", "recipe-2x3090")
    planned = run_glm53("plan", "host", "--profile", "exl3-2x3090", *rig, "--expert-cache", "--env")
    assert planned.code == 0, planned.stderr
    window = _env_lines(planned.stdout)["EXPERT_CACHE_WINDOW"]
    shown = _dry_run(*rig, *_sets(EXPERT_CACHE="1"), profile="exl3-2x3090")
    values = shown["values"]
    assert values["EXPERT_CACHE_WINDOW"]["value"] == window and values["EXPERT_CACHE_WINDOW"]["origin"] == "plan"
    for key in ("EXL3_MOE_CPU_SPLIT", "CPU_MOE_OFFLOAD_LAYERS", "EXPERT_CACHE_PINNED"):
        assert values[key]["value"] == "0" and values[key]["origin"] == "plan", key
    assert shown["launch"]["argv"][2] == RUNNER
    # the user's value over the plan's
    shown = _dry_run(*rig, *_sets(EXPERT_CACHE="1", EXPERT_CACHE_WINDOW="4"), profile="exl3-2x3090")
    assert shown["values"]["EXPERT_CACHE_WINDOW"] == {"value": "4", "origin": "set", "source": "--set"}
    assert shown["launch"]["env"]["EXPERT_CACHE_WINDOW"] == "4"


# ---------------------------------------------------------------- glm53 serve: settings it refuses

NOT_JSON = "not json {"
STATS_FILES = {
    "not-json.json": NOT_JSON,
    "a-list.json": "[[1, 2]]",
    "empty.json": "{}",
    "a-number.json": json.dumps({KEY.format(3): 3}),
    "text-counts.json": json.dumps({KEY.format(3): [1, "2"]}),
    "nan-counts.json": f'{{"{KEY.format(3)}": [1, NaN]}}',
    "infinite-counts.json": f'{{"{KEY.format(3)}": [1, 1e999]}}',
    "bool-counts.json": json.dumps({KEY.format(3): [True, False]}),
    "no-counts.json": json.dumps({KEY.format(3): []}),
}
ONE = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "4"}


@pytest.mark.parametrize(
    ("sets", "named", "fix"),
    [
        ({"EXPERT_CACHE": "1"}, "EXPERT_CACHE=1 needs EXPERT_CACHE_WINDOW", "--set EXPERT_CACHE_WINDOW=N"),
        ({**ONE, "EXPERT_CACHE_WINDOW": "0"}, "EXPERT_CACHE_WINDOW=0 and EXPERT_CACHE_PINNED=0", "EXPERT_CACHE=0"),
        ({**ONE, "EXPERT_CACHE_PINNED": "2"}, "EXPERT_CACHE_PINNED=2 needs EXPERT_CACHE_STATS", "--stats"),
        ({**ONE, "EXPERT_CACHE_STATS": "{tmp}/missing.json"}, "EXPERT_CACHE_STATS {tmp}/missing.json", "counts"),
        ({**ONE, "EXPERT_CACHE_STATS": "{tmp}/not-json.json"}, "EXPERT_CACHE_STATS {tmp}/not-json.json", "counts"),
        ({**ONE, "EXL3_MOE_CPU_SPLIT": "8"}, "EXPERT_CACHE=1 with EXL3_MOE_CPU_SPLIT=8", "set them to 0"),
        ({**ONE, "CPU_MOE_OFFLOAD_LAYERS": "3"}, "EXPERT_CACHE=1 with CPU_MOE_OFFLOAD_LAYERS=3", "set them to 0"),
        ({**ONE, "EXPERT_CACHE": "2"}, "EXPERT_CACHE", "EXPERT_CACHE"),  # the profile's choices
        ({**ONE, "EXPERT_CACHE_WINDOW": "-1"}, "EXPERT_CACHE_WINDOW='-1' is not between 0 and 8,192", "LRU slots"),
        ({**ONE, "EXPERT_CACHE_WINDOW": "99999"}, "EXPERT_CACHE_WINDOW='99999' is not between 0 and 8,192", "LRU"),
        ({**ONE, "EXPERT_CACHE_PINNED": "two"}, "EXPERT_CACHE_PINNED='two' is not an integer", "pinned"),
    ],
)
def test_bad_cache_settings_exit_2_naming_the_key_and_a_fix(
    run_dir: Path, tmp_path: Path, sets: dict[str, str], named: str, fix: str
) -> None:
    (tmp_path / "not-json.json").write_text(NOT_JSON)
    filled = {key: value.format(tmp=tmp_path) for key, value in sets.items()}
    result = run_glm53("serve", "--profile", "exl3-1gpu", "--dry-run", *_sets(**filled))
    assert result.code == 2, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    hint = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    assert len(error) == 1 and named.format(tmp=tmp_path) in error[0], result.stderr
    assert len(hint) == 1 and fix in hint[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("name", sorted(set(STATS_FILES) - {"not-json.json"}))
def test_a_stats_file_that_is_not_counts_exits_2_naming_it(run_dir: Path, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(STATS_FILES[name])
    result = run_glm53("serve", "--profile", "exl3-1gpu", "--dry-run", *_sets(**ONE, EXPERT_CACHE_STATS=str(path)))
    assert result.code == 2, result.stderr
    assert f"error: EXPERT_CACHE_STATS {path}" in result.stderr
    assert "not a JSON object" in result.stderr or "is not a list of finite counts" in result.stderr
    assert "Traceback" not in result.stderr


def test_cache_settings_reads_the_engines_keys(tmp_path: Path) -> None:
    stats = tmp_path / "counts.json"
    stats.write_text(json.dumps({KEY.format(3): [1, 7, 3], KEY.format(4): [0.5, 0.25, 2.0]}))
    assert cache_settings({}) is None
    assert cache_settings({"EXPERT_CACHE": "0", "EXPERT_CACHE_WINDOW": "nonsense"}) is None  # off: not read
    assert cache_settings({"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "7"}) == CacheSettings(7, 0, None)
    env = {
        "EXPERT_CACHE": "1",
        "EXPERT_CACHE_WINDOW": "0",
        "EXPERT_CACHE_PINNED": "2",
        "EXPERT_CACHE_STATS": str(stats),
    }
    assert cache_settings(env) == CacheSettings(window=0, pinned=2, stats=stats)  # every slot pinned
    assert read_rankings(stats) == {KEY.format(3): [1, 2, 0], KEY.format(4): [2, 0, 1]}
    # equal counts: the lower expert first, as the engine pins them
    stats.write_text(json.dumps({KEY.format(3): [4, 9, 4, 9]}))
    assert read_rankings(stats) == {KEY.format(3): [1, 3, 0, 2]}


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            key: st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=4)
            | st.sampled_from(["0", "1", "2", "", "00", "8192"])
            for key in ("EXPERT_CACHE", "EXPERT_CACHE_WINDOW", "EXPERT_CACHE_PINNED", "EXPERT_CACHE_RECENT")
        }
        | {
            "EXPERT_CACHE_POLICY": st.sampled_from(["lru", "frequency", "", "LRU", "lfu"]),
            "EXPERT_CACHE_HALF_LIFE": st.sampled_from(["", "0", "-1", "nan", "inf", "1e400", "0.5", "256", "x"]),
        },
    )
)
def test_cache_settings_is_a_setting_or_badinput(env: dict[str, str]) -> None:
    try:
        found = cache_settings(env)
    except BadInput as exc:
        assert any(key in exc.message for key in CACHE_KEYS), exc.message
        return
    if found is None:
        assert env.get("EXPERT_CACHE", "0") in ("", "0")
    else:
        assert env["EXPERT_CACHE"] == "1" and found.window + found.pinned > 0 and found.pinned == 0
        assert found.policy in ("lru", "frequency") and found.half_life > 0 and math.isfinite(found.half_life)
        assert found.rate >= 1.0


def test_cache_settings_reads_the_frequency_policy() -> None:
    base = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "80", "EXPERT_CACHE_POLICY": "frequency"}
    assert cache_settings(base) == CacheSettings(80, 0, None, "frequency", 1, 256.0)
    found = cache_settings({**base, "EXPERT_CACHE_RECENT": "4", "EXPERT_CACHE_HALF_LIFE": "32.5"})
    assert found == CacheSettings(80, 0, None, "frequency", 4, 32.5)
    assert found is not None and found.rate == 2.0 ** (1.0 / 32.5)  # the simulator's own expression
    refusals = [
        ({"EXPERT_CACHE_PINNED": "8", "EXPERT_CACHE_STATS": "/dev/null"}, "pins no slots", "EXPERT_CACHE_PINNED=0"),
        ({"EXPERT_CACHE_POLICY": "lfu"}, "EXPERT_CACHE_POLICY=lfu is not one of lru, frequency", "=lru"),
        ({"EXPERT_CACHE_HALF_LIFE": "0"}, "not a positive number of steps", "N > 0"),
        ({"EXPERT_CACHE_HALF_LIFE": "inf"}, "not a positive number of steps", "N > 0"),
        ({"EXPERT_CACHE_RECENT": "-1"}, "EXPERT_CACHE_RECENT=-1 is not a count", "N >= 0"),
        ({"EXPERT_CACHE_POLICY": "lru", "EXPERT_CACHE_HALF_LIFE": "9"}, "a setting of the frequency policy", "unset"),
    ]
    for extra, message, fix in refusals:
        with pytest.raises(BadInput, match=message) as caught:
            cache_settings({**base, **extra})
        assert fix in str(caught.value.fix), extra


def test_cache_settings_reads_where_the_experts_live() -> None:
    base = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "80"}
    assert cache_settings(base) == CacheSettings(80, 0, None)  # gpu: ExLlamaV3's own loader
    assert cache_settings({**base, "EXPERT_CACHE_EXPERTS": "host"}) == CacheSettings(80, 0, None, experts="host")
    with pytest.raises(BadInput, match="EXPERT_CACHE_EXPERTS=cpu is not one of gpu, host") as caught:
        cache_settings({**base, "EXPERT_CACHE_EXPERTS": "cpu"})
    assert "EXPERT_CACHE_EXPERTS=host" in str(caught.value.fix)


class _ParsedHeaders:
    """What the host loader reads of ExLlamaV3's SafetensorsCollection (exllamav3/loader/safetensors.py 1.4.6):
    `tensor_file_map` (tensor name -> file) and `file_headers` (file -> its JSON header, with `_header_offset`,
    the data section's start: 8 bytes of length, then the header)."""

    def __init__(self, path: Path) -> None:
        raw = path.read_bytes()
        length = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + length])
        header["_header_offset"] = 8 + length
        self.tensor_file_map = {key: str(path) for key in header if key not in ("__metadata__", "_header_offset")}
        self.file_headers = {str(path): header}


def test_the_host_loader_reads_a_trellis_from_the_checkpoint_file(tmp_path: Path) -> None:
    """A real safetensors file: each int16 trellis read at its offset is the tensor's bytes; another dtype or
    rank is refused, naming the tensor and the file."""
    from safetensors.numpy import save_file

    from glm53.serve.engines.exllamav3.expert_cache import read_exactly, tensor_header

    rng = np.random.default_rng(0)
    tensors = {
        "layers.3.mlp.experts.0.gate_proj.trellis": rng.integers(-(2**15), 2**15, (4, 2, 48), dtype=np.int16),
        "layers.3.mlp.experts.1.down_proj.trellis": rng.integers(-(2**15), 2**15, (2, 4, 48), dtype=np.int16),
        "layers.3.mlp.experts.0.gate_proj.suh": np.ones(64, dtype=np.float16),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    stc = _ParsedHeaders(path)
    with path.open("rb") as handle:
        for key, tensor in tensors.items():
            if not key.endswith(".trellis"):
                with pytest.raises(RuntimeError, match=rf"{re.escape(key)} in {re.escape(str(path))}: F16 \[64\]"):
                    tensor_header(stc, key)
                continue
            filename, shape, offset, nbytes = tensor_header(stc, key)
            assert (filename, shape, nbytes) == (str(path), list(tensor.shape), tensor.nbytes)
            into = np.zeros(nbytes + 6, dtype=np.uint8)  # read into the middle of a larger row, as into the pool
            read_exactly(handle, offset, into[3 : 3 + nbytes])
            assert into[3 : 3 + nbytes].view(np.int16).reshape(tensor.shape).tolist() == tensor.tolist()
            assert into[:3].tolist() == [0, 0, 0] and into[-3:].tolist() == [0, 0, 0]
        with pytest.raises(RuntimeError, match="bytes missing at offset"):
            read_exactly(handle, path.stat().st_size - 4, np.zeros(16, dtype=np.uint8))


class _HostRegistry:
    """The two calls HostExperts makes of glm53_expert_cache: page-lock and map a host tensor (here: its address,
    as a CPU arena reads it directly), and release it."""

    def __init__(self) -> None:
        self.registered: list[int] = []

    def host_register(self, tensor: Any) -> int:
        self.registered.append(tensor.data_ptr())
        return int(tensor.data_ptr())

    def host_unregister(self, tensor: Any) -> None:
        self.registered.remove(tensor.data_ptr())


def test_host_resident_experts_are_laid_out_as_the_cache_slots_and_staged_per_layer(tmp_path: Path) -> None:
    """HostExperts on a real safetensors checkpoint of two MoE layers (3 experts, gate/up/down trellis each), its
    arena on the CPU so that the layout can be read here: each expert's bytes land in its layer's host pool row at
    the cache's gate|up|down offsets; the engine's tensors are views of one arena that holds whichever layer was
    staged last; a shape that differs from the layer's is refused, naming the tensor."""
    import torch
    from safetensors.numpy import save_file

    from glm53.serve.engines.exllamav3.expert_cache import HostExperts

    shapes = {"gate_proj": (4, 2, 48), "up_proj": (4, 2, 48), "down_proj": (2, 4, 48)}
    rng = np.random.default_rng(1)
    tensors = {
        f"layers.{layer}.mlp.experts.{e}.{part}.trellis": rng.integers(-(2**15), 2**15, shape, dtype=np.int16)
        for layer in (3, 4)
        for e in range(3)
        for part, shape in shapes.items()
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    stc = _ParsedHeaders(path)

    class _Linear:
        def __init__(self, key: str) -> None:
            self.key = key

    class _Mlp:
        def __init__(self, layer: int) -> None:
            self.key, self.num_experts = f"layers.{layer}.mlp", 3
            self.gates, self.ups, self.downs = (
                [_Linear(f"layers.{layer}.mlp.experts.{e}.{part}") for e in range(3)] for part in shapes
            )

    registry = _HostRegistry()
    host = HostExperts(registry)
    views = {}
    for layer in (3, 4):
        mlp = _Mlp(layer)
        for part, linears in enumerate((mlp.gates, mlp.ups, mlp.downs)):
            for e, linear in enumerate(linears):
                key = linear.key + ".trellis"
                views[key] = host.trellis(mlp, part, e, stc, key, "cpu")
                assert tuple(views[key].shape) == tensors[key].shape and views[key].dtype == torch.int16
    pools = host.layers
    assert sorted(pools) == ["layers.3.mlp", "layers.4.mlp"] and len(registry.registered) == 2
    pool = pools["layers.3.mlp"]
    assert pool.offsets == [0, 4 * 2 * 48 * 2, 2 * 4 * 2 * 48 * 2] and pool.slot_bytes == 3 * 4 * 2 * 48 * 2
    for e in range(3):
        row = pool.pool[e].numpy()
        for part, offset in zip(shapes, pool.offsets, strict=True):
            expected = tensors[f"layers.3.mlp.experts.{e}.{part}.trellis"]
            assert row[offset : offset + expected.nbytes].view(np.int16).reshape(expected.shape).tolist() == (
                expected.tolist()
            )
    # one arena for both layers: the engine's tensors read the layer staged last
    for layer, other in ((3, 4), (4, 3), (3, 4)):
        host.stage(f"layers.{layer}.mlp")
        for key, view in views.items():
            mine = key.replace(f"layers.{other}.", f"layers.{layer}.")
            assert view.numpy().tolist() == tensors[mine].tolist(), key
    # a shape other than the layer's first expert's is refused
    odd = tmp_path / "odd" / "model.safetensors"
    odd.parent.mkdir()
    save_file({**tensors, "layers.3.mlp.experts.2.up_proj.trellis": np.zeros((2, 4, 48), np.int16)}, str(odd))
    fresh = HostExperts(_HostRegistry())
    mlp = _Mlp(3)
    fresh.trellis(mlp, 1, 0, _ParsedHeaders(odd), "layers.3.mlp.experts.0.up_proj.trellis", "cpu")
    with pytest.raises(RuntimeError, match=r"layers\.3\.mlp\.experts\.2\.up_proj\.trellis: shape \[2, 4, 48\]"):
        fresh.trellis(mlp, 1, 2, _ParsedHeaders(odd), "layers.3.mlp.experts.2.up_proj.trellis", "cpu")
    host.drop("layers.3.mlp")
    assert sorted(host.layers) == ["layers.4.mlp"] and len(registry.registered) == 1


def test_a_superscript_window_is_badinput() -> None:
    with pytest.raises(BadInput, match="EXPERT_CACHE_WINDOW"):
        cache_settings({"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "²"})


# read_rankings on hostile JSON: rankings or BadInput, nothing else.
FLOAT_RANGE_INTS = st.integers(min_value=-(10**300), max_value=10**300)
SCALARS = st.none() | st.booleans() | FLOAT_RANGE_INTS | st.floats() | st.text(max_size=4)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
COUNTS = st.lists(FLOAT_RANGE_INTS | st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=12)
DOCUMENTS = st.dictionaries(st.text(max_size=12), COUNTS | VALUES, max_size=4) | VALUES


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(DOCUMENTS.map(lambda doc: json.dumps(doc).encode()), st.binary(max_size=64)))
def test_read_rankings_on_hostile_json_ranks_or_refuses(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "counts.json"
    path.write_bytes(raw)
    try:
        rankings = read_rankings(path)
    except BadInput as exc:
        assert f"EXPERT_CACHE_STATS {path}" in exc.message
        return
    data = json.loads(raw)
    assert isinstance(data, dict) and set(rankings) == set(data)
    for key, ranking in rankings.items():
        counts = data[key]
        assert sorted(ranking) == list(range(len(counts)))  # a permutation of the experts
        ordered = [counts[e] for e in ranking]
        assert all(a >= b for a, b in itertools.pairwise(ordered))  # hottest first


@pytest.mark.parametrize("digits", [400, 5000])
def test_read_rankings_refuses_counts_no_float_holds(tmp_path: Path, digits: int) -> None:
    path = tmp_path / "counts.json"
    path.write_text(f'{{"{KEY.format(3)}": [1, {"9" * digits}]}}')
    with pytest.raises(BadInput, match="EXPERT_CACHE_STATS"):
        read_rankings(path)


# ---------------------------------------------------------------- glm53 plan host --expert-cache

RIG = ("--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--expert-cache")


def _plan_host(*extra: str) -> CliResult:
    return run_glm53("plan", "host", *RIG, *extra)


def test_plan_host_sizes_the_cache_from_the_gpu_budget() -> None:
    printed = _plan_host("--env")
    assert printed.code == 0, printed.stderr
    env = _env_lines(printed.stdout)
    assert env["EXPERT_CACHE"] == "1" and int(env["EXPERT_CACHE_WINDOW"]) > 0
    assert (env["EXPERT_CACHE_PINNED"], env["EXL3_MOE_CPU_SPLIT"], env["CPU_MOE_OFFLOAD_LAYERS"]) == ("0", "0", "0")
    assert env["EXL3_MOE_CPU_SPLIT_LAYERS"] == "0" and "EXL3_MOE_CPU_THREADS" not in env  # no CPU worker

    result = _plan_host("--json")
    assert result.code == 0, result.stderr
    plan = result.json()
    cache = plan["expert_cache"]
    window, pinned = int(env["EXPERT_CACHE_WINDOW"]), int(env["EXPERT_CACHE_PINNED"])
    assert {k: plan["env"][k] for k in env} == env  # --env prints the plan's keys
    assert cache["slots"] == window + pinned and cache["pinned"] == pinned
    # The budget the planner gave the cache: each GPU's budget less what its own layers hold besides the experts
    # (the decoder layers in order, an equal count of MoE layers a GPU) and the scratch; the least room decides.
    room = cache["cache_bytes_per_gpu"]
    gpus = plan["gpus"]
    assert 0 < room < min(g["budget_bytes"] for g in gpus)
    size = size_cache(model_facts(None), room, gpus=len(gpus), sequences=plan["shape"]["max_num_seqs"])
    assert (size.slots, size.window, size.staging) == (window + pinned, window, cache["staging"])
    assert cache["layers_per_gpu"] == math.ceil(42 / len(gpus)) and cache["staging"] == 8
    # it fits, and one more slot a layer would not (or every expert is resident)
    used = cache["layers_per_gpu"] * (cache["slots"] + cache["staging"]) * cache["slot_bytes"]
    assert used <= cache["cache_bytes_per_gpu"]
    more = cache["layers_per_gpu"] * (cache["slots"] + 1 + cache["staging"]) * cache["slot_bytes"]
    assert more > cache["cache_bytes_per_gpu"] or cache["slots"] == cache["experts"]
    # every routed expert does not fit the recipe's GPUs: host-resident experts, one layer's staging arena a GPU
    assert plan["offload"]["mode"] != "gpu"
    assert env["EXPERT_CACHE_EXPERTS"] == "host"
    assert cache["arena_bytes_per_gpu"] == cache["experts"] * cache["slot_bytes"]
    assert any("EXPERT_CACHE_EXPERTS=host" in warning for warning in plan["warnings"])


def test_every_gpu_holds_its_cache_beside_its_own_ledger() -> None:
    result = _plan_host("--json")
    assert result.code == 0, result.stderr
    plan = result.json()
    cache = plan["expert_cache"]
    used = cache["layers_per_gpu"] * (cache["slots"] + cache["staging"]) * cache["slot_bytes"]
    used += cache["arena_bytes_per_gpu"]  # host-resident experts: the staging arena beside the slots
    for gpu in plan["gpus"]:
        fixed = gpu["non_expert_bytes"] + gpu["kv_cache_bytes"] + gpu["recurrent_state_bytes"] + gpu["scratch_bytes"]
        assert fixed + used <= gpu["budget_bytes"], gpu["index"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "agent-256k", "--rig", "recipe-2x3090"], "; profile agent-256k runs on vllm"),
        (["--rig", "recipe-2x3090"], "--expert-cache plans the GPU expert cache of the exllamav3 engine"),
    ],
)
def test_expert_cache_needs_an_exl3_profile(args: list[str], message: str) -> None:
    result = run_glm53("plan", "host", *args, "--expert-cache")
    assert result.code == 2
    assert message in result.stderr and "hint: add --profile exl3-1gpu or --profile exl3-2x3090" in result.stderr


# ---------------------------------------------------------------- glm53 plan host --expert-cache --stats


def _scan_trace(layers: tuple[int, ...], steps: int = 3000) -> RoutingTrace:
    """A scan over all 288 experts with experts 0-39 routed twice a round: every expert comes back after more
    distinct experts than an LRU window holds, so only pinning hits, and pinning the 40 hottest hits."""
    order = np.array(list(range(288)) + list(range(40)))  # 328 = 41 steps of 8, no expert twice in a step
    flat = np.resize(order, steps * 8).reshape(steps, 8)
    return RoutingTrace(layers, 288, 8, np.repeat(flat[:, None, :], len(layers), axis=1).astype(np.int16))


def test_plan_with_a_trace_writes_the_cache_keys(tmp_path: Path) -> None:
    trace = tmp_path / "routing.npz"
    synth = run_glm53("plan", "trace", "synth", "--out", str(trace), "--steps", "3000", "--seed", "1")
    assert synth.code == 0, synth.stderr
    out = tmp_path / "plan"
    result = _plan_host("--stats", str(trace), "--out", str(out))
    assert result.code == 0, result.stderr
    env = _env_lines((out / "plan.env").read_text())
    plan = json.loads((out / "plan.json").read_text())
    cache, choice = plan["expert_cache"], plan["cache_choice"]
    assert int(env["EXPERT_CACHE_WINDOW"]) + int(env["EXPERT_CACHE_PINNED"]) == cache["slots"] > 0
    assert int(env["EXPERT_CACHE_PINNED"]) == cache["pinned"] == round(choice["pinned_fraction"] * cache["slots"])
    assert env["EXPERT_CACHE_POLICY"] == choice["policy"]
    assert cache_settings(env) is not None  # what the plan writes, the runner takes
    assert env["EXPERT_CACHE"] == "1" and plan["env"] == env
    # the chosen share is never a quarter point below plain LRU on any scenario
    assert all(h >= lru - 0.0025 for h, lru in zip(choice["hit_rates"], choice["lru_hit_rates"], strict=True))
    assert plan["placement"] is None and plan["recommendation"] is None  # no CPU split to place
    assert (out / "exl3-split-stats.json").is_file()
    if cache["pinned"] == 0:
        assert "EXPERT_CACHE_STATS" not in env
    else:
        assert env["EXPERT_CACHE_STATS"] == str((out / "exl3-split-stats.json").resolve())


def test_a_trace_with_a_hot_set_gets_the_policy_that_keeps_it_and_the_keys_reach_the_runner(
    tmp_path: Path, run_dir: Path
) -> None:
    """Experts 0-39 come back twice as often as the rest, which an LRU window cannot see. Pinning them (learned
    on the first half) and decayed counts both keep them; the counts also follow the re-permuted scenario, where
    the learned ranking goes stale, so the robust choice is the frequency policy, with its keys and no pinned
    slots or counts file."""
    trace = tmp_path / "scan.npz"
    write_trace(trace, _scan_trace(tuple(range(3, 15))))
    out = tmp_path / "plan"
    result = _plan_host("--stats", str(trace), "--out", str(out))
    assert result.code == 0, result.stderr
    env = _env_lines((out / "plan.env").read_text())
    plan = json.loads((out / "plan.json").read_text())
    choice = plan["cache_choice"]
    assert choice["policy"] == "frequency" and choice["label"].startswith("decayed frequency")
    assert choice["worst_gain_over_lru"] > 0.05  # points of hit rate on its worst stress scenario
    # what it claims over the recipe's 20% pinned: its worst scenario's margin, printed beside the LRU gain
    margins = [hit - recipe for hit, recipe in zip(choice["hit_rates"], choice["recipe_hit_rates"], strict=True)]
    assert choice["worst_gain_over_recipe"] == min(margins) > 0.04
    assert f"{choice['worst_gain_over_recipe']:+.2%} vs the recipe's 20% pinned" in result.stdout
    assert env["EXPERT_CACHE_POLICY"] == "frequency" and env["EXPERT_CACHE_PINNED"] == "0"
    assert int(env["EXPERT_CACHE_WINDOW"]) == plan["expert_cache"]["slots"]
    assert (
        env["EXPERT_CACHE_RECENT"] == str(choice["recent"])
        and float(env["EXPERT_CACHE_HALF_LIFE"]) == choice["half_life"]
    )
    assert "EXPERT_CACHE_STATS" not in env
    settings_ = cache_settings(env)
    assert settings_ is not None and settings_.policy == "frequency" and settings_.half_life == choice["half_life"]
    assert "frequency policy" in result.stdout
    # and the plan serves: the runner gets the policy's keys, each with the plan as its origin
    shown = _dry_run("--plan-env", str(out / "plan.env"), profile="exl3-2x3090")
    assert shown["launch"]["argv"][2] == RUNNER
    for key in ("EXPERT_CACHE_POLICY", "EXPERT_CACHE_RECENT", "EXPERT_CACHE_HALF_LIFE"):
        assert shown["launch"]["env"][key] == env[key]


def test_a_trace_of_another_model_exits_2(tmp_path: Path) -> None:
    trace = tmp_path / "other.npz"
    synth = run_glm53("plan", "trace", "synth", "--out", str(trace), "--steps", "100", "--experts", "64")
    assert synth.code == 0, synth.stderr
    result = _plan_host("--stats", str(trace), "--out", str(tmp_path / "plan"))
    assert result.code == 2
    assert "64 experts" in result.stderr and "288" in result.stderr
    assert not (tmp_path / "plan" / "plan.env").exists()


# ---------------------------------------------------------------- glm53 plan expert-cache-check

LAYERS = (3, 4, 5)
EXPERTS, TOP_K, STEPS = 32, 4, 300


@pytest.fixture(scope="module")
def capture() -> RoutingTrace:
    return synthesize_trace(
        SyntheticTraceSpec(steps=STEPS, layers=LAYERS, experts=EXPERTS, top_k=TOP_K, locality=0.3, seed=5)
    )


def _engine_report(
    trace: RoutingTrace, window: int, pinned: int = 0, rankings: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """What the engine's expert-cache.json holds after serving `trace`: its lookup kernel written out step by
    step (`replay_lookups`, held to the CUDA kernel in tests/test_expert_cache.py) gives each layer's hits."""
    layers = {}
    for index, layer in enumerate(trace.layers):
        key = KEY.format(layer)
        ranking = (rankings or {}).get(key, list(range(trace.experts)))
        hits = int(replay_lookups(trace.routes[:, index, :], trace.experts, ranking, pinned, window).sum())
        lookups = trace.steps * trace.top_k
        layers[key] = {"steps": trace.steps, "hits": hits, "misses": lookups - hits, "overflow": 0}
    hits = sum(row["hits"] for row in layers.values())
    return {"window": window, "pinned": pinned, "stats": None, "hits": hits, "layers": layers}


def _check(tmp_path: Path, report: object, trace: RoutingTrace, *extra: str) -> CliResult:
    report_path, capture_path = tmp_path / "expert-cache.json", tmp_path / "routing.npz"
    report_path.write_text(json.dumps(report))
    if not capture_path.exists():
        write_trace(capture_path, trace)
    return run_glm53("plan", "expert-cache-check", str(report_path), str(capture_path), *extra)


def test_an_engine_report_equal_to_the_simulator_passes(tmp_path: Path, capture: RoutingTrace) -> None:
    report = _engine_report(capture, window=6)
    result = _check(tmp_path, report, capture)
    assert result.code == 0, result.stderr
    assert "equal on every layer" in result.stdout
    shown = _check(tmp_path, report, capture, "--json")
    assert shown.code == 0, shown.stderr
    check = shown.json()
    assert check["equal"] is True and (check["window"], check["pinned"], check["steps"]) == (6, 0, STEPS)
    assert [row["layer"] for row in check["layers"]] == list(LAYERS)
    assert [row["simulated_hits"] for row in check["layers"]] == [
        report["layers"][KEY.format(layer)]["hits"] for layer in LAYERS
    ]
    assert 0 < sum(row["engine_hits"] for row in check["layers"]) < STEPS * TOP_K * len(LAYERS)


def _altered(report: dict[str, Any], layer: int, **fields: int) -> dict[str, Any]:
    altered: dict[str, Any] = json.loads(json.dumps(report))
    for name, delta in fields.items():
        altered["layers"][KEY.format(layer)][name] += delta
    return altered


@pytest.mark.parametrize(
    "change",
    [
        {"hits": 1, "misses": -1},  # one hit more, the same lookups
        {"hits": -1, "misses": 1},
        {"misses": -1},  # a lookup short: the engine missed a decode step's selection
        {"overflow": 1},  # a step's misses did not fit the staging slots
    ],
)
def test_a_report_that_differs_exits_1(tmp_path: Path, capture: RoutingTrace, change: dict[str, int]) -> None:
    result = _check(tmp_path, _altered(_engine_report(capture, window=6), 4, **change), capture)
    assert result.code == 1, result.stderr
    assert "DIFFERENT" in result.stdout and "the engine's cache and the simulator differ" in result.stderr


def test_a_window_other_than_the_engines_differs(tmp_path: Path, capture: RoutingTrace) -> None:
    report = _engine_report(capture, window=6)
    report["window"] = 7
    assert _check(tmp_path, report, capture).code == 1


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ([1, 2], "is not an expert-cache report"),
        ({"window": 4}, "not an expert-cache report"),
        ({"window": 4, "pinned": 0, "layers": [1]}, "not an expert-cache report"),
        ({"window": "four", "pinned": 0, "layers": {}}, "not an expert-cache report"),
        ({"window": 4, "pinned": 0, "layers": {KEY.format(3): {"hits": 1}}}, "not an expert-cache report"),
        ({"window": 4, "pinned": 0, "layers": {"model.embed": {"hits": 1, "misses": 0, "overflow": 0}}}, "embed"),
        ({"window": 4, "pinned": 0, "layers": {KEY.format(9): {"hits": 1, "misses": 0, "overflow": 0}}}, "layer 9"),
        ({"window": 4, "pinned": 2, "layers": {KEY.format(3): {"hits": 1, "misses": 0, "overflow": 0}}}, "--stats"),
    ],
)
def test_a_report_that_cannot_be_checked_exits_2(
    tmp_path: Path, capture: RoutingTrace, report: object, message: str
) -> None:
    result = _check(tmp_path, report, capture)
    assert result.code == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_pinned_report_checks_with_the_counts_it_ranked_by(tmp_path: Path, capture: RoutingTrace) -> None:
    stats = tmp_path / "counts.json"
    counts = capture.counts()
    stats.write_text(json.dumps({KEY.format(layer): counts[i].tolist() for i, layer in enumerate(LAYERS)}))
    rankings = read_rankings(stats)
    report = _engine_report(capture, window=4, pinned=3, rankings=rankings)
    result = _check(tmp_path, report, capture, "--stats", str(stats))
    assert result.code == 0, result.stdout + result.stderr
    # pinning the hottest three helps over pinning the first three ids
    by_id = _engine_report(capture, window=4, pinned=3)
    assert report["hits"] > by_id["hits"]
    assert _check(tmp_path, by_id, capture, "--stats", str(stats)).code == 1
    # counts of another expert count
    stats.write_text(json.dumps({KEY.format(layer): [1] * 16 for layer in LAYERS}))
    short = _check(tmp_path, report, capture, "--stats", str(stats))
    assert short.code == 2 and "rank 16 experts, the capture routes 32" in short.stderr


def test_counts_that_lack_a_reported_layer_exit_2(tmp_path: Path, capture: RoutingTrace) -> None:
    counts = capture.counts()
    served = tmp_path / "served.json"  # the counts the engine ranked by, under its module keys
    served.write_text(json.dumps({KEY.format(layer): counts[i].tolist() for i, layer in enumerate(LAYERS)}))
    report = _engine_report(capture, window=4, pinned=3, rankings=read_rankings(served))
    assert _check(tmp_path, report, capture, "--stats", str(served)).code == 0
    other = tmp_path / "other.json"  # the same counts under keys the report does not name
    other.write_text(json.dumps({f"model.layers.{layer}.mlp": counts[i].tolist() for i, layer in enumerate(LAYERS)}))
    assert _check(tmp_path, report, capture, "--stats", str(other)).code == 2


@st.composite
def _served(draw: st.DrawFn) -> tuple[RoutingTrace, int, int, np.ndarray]:
    experts = draw(st.integers(4, 24))
    top_k = draw(st.integers(1, min(4, experts)))
    steps = draw(st.integers(1, 30))
    layers = draw(st.integers(1, 3))
    routes = np.array(
        [[draw(st.permutations(range(experts)))[:top_k] for _ in range(layers)] for _ in range(steps)], dtype=np.int16
    )
    counts = np.array(
        [draw(st.lists(st.integers(0, 50), min_size=experts, max_size=experts)) for _ in range(layers)],
        dtype=np.int64,
    )
    pinned = draw(st.integers(1, experts))
    window = draw(st.integers(0, experts - pinned))
    return RoutingTrace(tuple(range(3, 3 + layers)), experts, top_k, routes), pinned, window, counts


def _hottest_first(counts: list[int]) -> list[int]:
    return sorted(range(len(counts)), key=lambda e: (-counts[e], e))


@settings(max_examples=150, deadline=None)
@given(_served())
def test_the_check_replays_the_kernels_algorithm_with_pinned_slots(
    case: tuple[RoutingTrace, int, int, np.ndarray],
) -> None:
    """Reports made by the lookup kernel's algorithm (replay_lookups) on random traces with pinned slots ranked by
    counts are equal to the check's replay (pinned_lru_step_hits), layer by layer."""
    trace, pinned, window, counts = case
    # rankings as read_rankings makes them from the counts file: hottest first, the lower id among equals
    rankings = {KEY.format(layer): _hottest_first(counts[i].tolist()) for i, layer in enumerate(trace.layers)}
    report = _engine_report(trace, window=window, pinned=pinned, rankings=rankings)
    check = check_cache_report(report, trace, rankings)
    assert check.equal, check
    stepwise = pinned_lru_step_hits(
        trace.routes.astype(np.int64),
        trace.experts,
        np.array([rankings[KEY.format(layer)] for layer in trace.layers], dtype=np.int64),
        [pinned] * len(trace.layers),
        [window] * len(trace.layers),
    )
    assert stepwise.hits.sum(axis=0).tolist() == [row.engine_hits for row in check.layers]


# ---------------------------------------------------------------- the runner, in a real child process

PROGRAM = textwrap.dedent("""
    # Stands in for TabbyAPI's main.py: writes what it was started with beside itself, exits with argv[1].
    import json, sys
    from pathlib import Path
    import sibling  # resolved from this file's directory, as TabbyAPI's own packages are
    Path(__file__).with_name("ran.json").write_text(json.dumps({
        "argv": sys.argv,
        "name": __name__,
        "sibling": sibling.NAME,
        "torch": "torch" in sys.modules,
        "exllamav3": "exllamav3" in sys.modules,
    }))
    sys.exit(int(sys.argv[1]))
""")


def _runner(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, paths: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`python -m glm53.serve.engines.exllamav3.expert_cache ARGS` as `glm53 serve` execs it, with only `env`
    (and glm53's source) in its environment."""
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(str(path) for path in (SOURCE, *paths)),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", RUNNER, *args],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def program(tmp_path: Path) -> Path:
    tree = tmp_path / "tabby"
    tree.mkdir()
    (tree / "sibling.py").write_text("NAME = 'tabby-sibling'\n")
    main = tree / "main.py"
    main.write_text(PROGRAM)
    return main


def test_the_runner_without_the_cache_runs_the_program_as_main(tmp_path: Path, program: Path) -> None:
    report = tmp_path / "run" / REPORT_NAME
    done = _runner(tmp_path, "--report", str(report), str(program), "0", "--config", "/run/glm53/config.yml")
    assert done.returncode == 0, done.stderr
    ran = json.loads(program.with_name("ran.json").read_text())
    assert ran == {
        "argv": [str(program), "0", "--config", "/run/glm53/config.yml"],
        "name": "__main__",
        "sibling": "tabby-sibling",
        "torch": False,
        "exllamav3": False,
    }
    assert not report.exists()
    # the program's own exit status is the runner's
    assert _runner(tmp_path, "--report", str(report), str(program), "7").returncode == 7


def test_the_runner_refuses_bad_settings_before_the_program_runs(tmp_path: Path, program: Path) -> None:
    done = _runner(tmp_path, "--report", str(tmp_path / REPORT_NAME), str(program), "0", env={"EXPERT_CACHE": "1"})
    assert done.returncode == 2
    assert "error: EXPERT_CACHE=1 needs EXPERT_CACHE_WINDOW" in done.stderr and "fix: " in done.stderr
    assert not program.with_name("ran.json").exists()
    stats = tmp_path / "counts.json"
    stats.write_text("[]")
    env = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "4", "EXPERT_CACHE_STATS": str(stats)}
    done = _runner(tmp_path, "--report", str(tmp_path / REPORT_NAME), str(program), "0", env=env)
    assert done.returncode == 2 and f"EXPERT_CACHE_STATS {stats}" in done.stderr
    assert not program.with_name("ran.json").exists()


def test_the_runner_hooks_nothing_until_exllamav3_is_imported(tmp_path: Path, program: Path) -> None:
    capture = tmp_path / "capture"
    env = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "4"}
    # The runner only finds the CUDA extension (importing it would load torch before TabbyAPI sets torch's
    # allocator): an empty module of its name stands in, as CI has no CUDA build of it.
    found = tmp_path / "found"
    found.mkdir()
    (found / "glm53_expert_cache.py").write_text(
        "raise ImportError('a stand-in is only found, never imported')\n# <glm53_expert_cache api 3>\n"
    )
    done = _runner(
        tmp_path,
        "--report",
        str(tmp_path / REPORT_NAME),
        "--capture",
        str(capture),
        str(program),
        "0",
        env=env,
        paths=(found,),
    )
    assert done.returncode == 0, done.stderr
    ran = json.loads(program.with_name("ran.json").read_text())
    assert ran["argv"] == [str(program), "0"] and ran["torch"] is False and ran["exllamav3"] is False
    assert capture.is_dir()  # made for the recorder
    assert not (tmp_path / REPORT_NAME).exists()  # no layer was cached, no queue drained


def test_a_cache_module_built_from_older_sources_is_refused_before_the_program_runs(
    tmp_path: Path, program: Path
) -> None:
    """A module without this runner's API marker (api 2: built before freed experts' entries waited for the next
    lookup): exit 3 naming it and the
    rebuild, found without importing it. The marker is in the real build (expert_cache.cu's API_MARKER)."""
    source = (Path(__file__).resolve().parents[1] / "pkgs/exllamav3/expert-cache/expert_cache.cu").read_text()
    assert f'API_MARKER = "{EXPERT_CACHE_MARKER.decode()}"' in source
    found = tmp_path / "found"
    found.mkdir()
    (found / "glm53_expert_cache.py").write_text(
        "raise ImportError('found, never imported')\n# <glm53_expert_cache api 2>\n"
    )
    env = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "4"}
    done = _runner(tmp_path, "--report", str(tmp_path / REPORT_NAME), str(program), "0", env=env, paths=(found,))
    assert done.returncode == 3, done.stderr
    assert f"error: {found / 'glm53_expert_cache.py'} was built from older sources" in done.stderr
    assert "build_ext.py" in done.stderr and "install-engine" in done.stderr
    assert not program.with_name("ran.json").exists()
    # the cache off: the same module is not read
    assert _runner(tmp_path, "--report", str(tmp_path / REPORT_NAME), str(program), "0", paths=(found,)).returncode == 0


@pytest.mark.skipif(
    importlib.util.find_spec("glm53_expert_cache") is not None, reason="the cache's extension is installed here"
)
def test_without_the_extension_a_cached_serve_fails_naming_it(tmp_path: Path) -> None:
    env = {"EXPERT_CACHE": "1", "EXPERT_CACHE_WINDOW": "4"}
    main = STAND_IN / "tabby" / "main.py"
    done = _runner(
        tmp_path, "--report", str(tmp_path / REPORT_NAME), str(main), "--config", "/x", paths=(STAND_IN,), env=env
    )
    assert done.returncode == 3  # the environment cannot run it: said before TabbyAPI starts
    assert "glm53_expert_cache" in done.stderr and "build_ext.py" in done.stderr
    assert not (tmp_path / REPORT_NAME).exists()


def test_the_cache_prediction_is_the_measured_step_model() -> None:
    """Decode with the cache: the all-resident GPU time, the measured overhead a MoE layer, and the misses' bytes
    over one link; at no hits every selection crosses it, at all hits none does."""
    from glm53.plan.exllamav3.expert_cache import (
        ASSUMED_LINK_BYTES_PER_S,
        CACHE_OVERHEAD_SECONDS,
        predict_cache,
    )

    facts = model_facts(None)
    size = size_cache(facts, 17_508_062_880, gpus=2)
    resident = 0.0196
    layers, lookups = len(facts.moe_layers), len(facts.moe_layers) * facts.num_experts_per_tok
    rates = {
        rate: predict_cache(size, facts, resident, hit_rate=rate, hit_rate_source="given") for rate in (0, 0.67, 1)
    }
    assert rates[1].miss_seconds == 0 and rates[1].overhead_seconds == pytest.approx(layers * CACHE_OVERHEAD_SECONDS)
    assert rates[0].miss_seconds == pytest.approx(lookups * facts.expert_bytes / ASSUMED_LINK_BYTES_PER_S)
    assert rates[0].tokens_per_s < rates[0.67].tokens_per_s < rates[1].tokens_per_s
    # the 2x3090 prediction (benchmarks/bench_expert_cache_2x3090.py) at 67% hits: 15.6 tok/s
    assert rates[0.67].tokens_per_s == pytest.approx(15.6, abs=0.2)
    floor = predict_cache(size, facts, resident)
    assert floor.hit_rate == pytest.approx(size.fraction, abs=1e-4) and "uniform" in floor.hit_rate_source


def test_plan_host_sets_the_caches_prediction_beside_the_splits() -> None:
    result = _plan_host("--json")
    assert result.code == 0, result.stderr
    plan = result.json()
    cache, split = plan["cache_prediction"], plan["prediction"]
    assert cache["tokens_per_s"] > 0 and cache["link_bytes_per_s"] == 25e9
    text = _plan_host()
    assert "predicted decode with the cache" in text.stdout
    faster = "the split" if split["tokens_per_s"] > cache["tokens_per_s"] else "the cache"
    assert f"{faster} " in text.stdout.split("predicted decode with the cache")[1].splitlines()[0]
