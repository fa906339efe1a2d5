"""No traceback from `plan`, `plan simulate`, `plan trace synth` or `probe` on odd input: each case is a clear
error naming the file, line, flag or field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from glm53.errors import BadInput, CheckFailed
from glm53.plan.finite import require_finite
from glm53.plan.routing.traces import RoutingTrace, read_routing_stats, read_trace
from glm53.plan.vllm.planner import build_plan
from tests.test_plan_cli import RIG, run

HEADER = {"format": "glm53-routing-trace", "version": 1, "layers": [3, 4], "experts": 4, "top_k": 2}
STEP = {"step": 0, "experts": [[0, 1], [2, 3]]}
PROBE = Path(__file__).parent / "fixtures" / "plan" / "probe-h200.json"


def _trace(path: Path, *lines: object) -> Path:
    path.write_bytes(b"".join(x if isinstance(x, bytes) else json.dumps(x).encode() + b"\n" for x in lines))
    return path


@pytest.mark.parametrize("rate", ["0", "-Infinity", "Infinity", "NaN", "-5", "1e400"])
def test_bandwidth_must_be_positive_and_finite(
    rate: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = json.loads(PROBE.read_text())
    text = json.dumps(probe).replace(str(probe["results"][0]["bytes_per_s"]), rate, 1)
    (tmp_path / "probe.json").write_text(text)
    code, out, err = run(
        ["plan", "host", *RIG, "--json", "--bandwidth", str(tmp_path / "probe.json")], capsys, monkeypatch
    )
    assert code == 2, err
    assert "--bandwidth" in err and "bytes_per_s" in err
    assert "Infinity" not in out and "NaN" not in out


def test_non_finite_json_is_never_written() -> None:
    with pytest.raises(CheckFailed, match=r"cost\.rate is not a finite number"):
        require_finite({"cost": {"rate": float("-inf")}}, what="the plan")
    assert require_finite({"a": [1.0, 2]}, what="x") == {"a": [1.0, 2]}


def test_out_on_an_existing_file_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("keep")
    code, _, err = run(["plan", "host", *RIG, "--out", str(tmp_path / "file")], capsys, monkeypatch)
    assert code == 2
    assert "is a file, not a directory" in err and "another path" in err
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--gpu-memory", "0"], "--gpu-memory"),
        (["--gpu-memory", "24GiB,0B"], "--gpu-memory"),
        (["--gpu-memory", ","], "--gpu-memory"),
        (["--gpus", "100000000000", "--gpu", "24GiB"], "--gpus"),
        ([*RIG, "--kv-cache-memory", "0"], "--kv-cache-memory"),
        ([*RIG, "--kv-cache-memory", "1e999"], "--kv-cache-memory"),
        ([*RIG, "--kv-cache-memory", "nan"], "--kv-cache-memory"),
        ([*RIG, "--kv-cache-memory", "9" * 40 + "TiB"], "--kv-cache-memory"),
        ([*RIG, "--gpu-workspace", "-1"], "--gpu-workspace"),
    ],
)
def test_bad_sizes_name_the_flag(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(["plan", "host", "--host-root", RIG[-1], *args], capsys, monkeypatch)
    assert code == 2, err
    assert flag in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (b'{"step":0,"experts":[[1e30,1],[2,3]]}\n', r"line 2: expert id 1e\+30 is not an integer"),
        (
            b'{"step":0,"experts":[[100000000000000000000,1],[2,3]]}\n',
            "line 2: expert id 100000000000000000000 outside",
        ),
        (b'{"step":0,"experts":[[1.7,0],[2,3]]}\n', "line 2: expert id 1.7 is not an integer"),
        (b'{"step":0,"experts":[["12",0],[2,3]]}\n', 'line 2: expert id "12" is not an integer'),
        (b'{"step":0,"experts":[[true,0],[2,3]]}\n', "line 2: expert id true is not an integer"),
        (b'{"step":0,"experts":[[NaN,0],[2,3]]}\n', "line 2: expert id NaN is not an integer"),
        (b'{"step":0,"experts":[[null,0],[2,3]]}\n', "line 2: expert id null is not an integer"),
        (b'{"step":0,"experts":[[0,1],[2,3]]}\xff\n', "line 2 is not UTF-8"),
        (b'{"step":0,"experts":[]}\n', "line 2: steps must hold 2 lists of 2 ids"),
    ],
)
def test_bad_expert_ids_are_rejected_with_the_line(tmp_path: Path, step: bytes, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        read_trace(_trace(tmp_path / "t.jsonl", HEADER, step))


def test_a_bad_step_names_its_own_line(tmp_path: Path) -> None:
    bad = {"step": 5, "experts": [[0, 1, 2], [2, 3]]}
    path = _trace(tmp_path / "t.jsonl", HEADER, STEP, STEP, b"\n", STEP, STEP, bad)
    with pytest.raises(BadInput, match="line 7: steps must hold 2 lists of 2 ids"):
        read_trace(path)
    path = _trace(tmp_path / "t.jsonl", HEADER, STEP, b"\n", {"step": 1, "experts": [[0, 9], [2, 3]]})
    with pytest.raises(BadInput, match=r"line 4: expert id 9 outside 0\.\.3"):
        read_trace(path)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({**HEADER, "experts": "4"}, "line 1: not a trace header"),
        ({**HEADER, "top_k": True}, "line 1: not a trace header"),
        ({**HEADER, "layers": [3, 3]}, "layer twice"),
        ({**HEADER, "experts": 10**30}, "line 1: not a trace header"),
    ],
)
def test_bad_headers(tmp_path: Path, header: dict[str, object], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        read_trace(_trace(tmp_path / "t.jsonl", header, STEP))


def test_trace_files_that_are_not_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path, tmp_path / "fifo", Path("/dev/zero")):
        with pytest.raises(BadInput, match="not a regular file"):
            read_routing_stats(path)
    with pytest.raises(BadInput, match="not found"):
        read_trace(tmp_path / "missing")


@pytest.mark.parametrize("value", ['"2"', "true", "1.5", "-1", "100000000000000000000"])
def test_counts_are_strict(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        '{"format":"glm53-routing-counts","version":1,"experts":2,"tokens":1,"layers":{"3":[1,' + value + "]}}"
    )
    with pytest.raises(BadInput, match=r"layers\.3\.1"):
        read_routing_stats(path)


def test_trace_with_another_top_k_is_refused_naming_both() -> None:
    from glm53.host.facts import read_host_facts
    from glm53.plan.inputs.gpus import GpuSpec
    from glm53.plan.inputs.model import load_architecture
    from glm53.plan.vllm.planner import ServingShape

    model = load_architecture()
    layers = model.moe_layers
    routes = np.tile(np.arange(4, dtype=np.int16), (10, len(layers), 1))
    trace = RoutingTrace(layers, model.n_routed_experts, 4, routes)
    host = read_host_facts(Path(RIG[-1]), engine_libraries=None)
    gpus = [GpuSpec(index=i, total_bytes=24 << 30) for i in range(2)]
    with pytest.raises(BadInput, match=r"top_k 4.*top_k 8"):
        build_plan(model, host, gpus, ServingShape(), stats=trace, stats_source="t.jsonl")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--experts", "40000"], "--experts"),
        (["--seed", "-1"], "--seed"),
        (["--steps", "100000000"], "--steps"),
    ],
)
def test_synth_flags_out_of_range(
    args: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(["plan", "trace", "synth", "--out", str(tmp_path / "t.jsonl"), *args], capsys, monkeypatch)
    assert code == 2, err
    assert flag in err
    assert not (tmp_path / "t.jsonl").exists()


def test_output_paths_that_are_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(["plan", "trace", "synth", "--out", str(tmp_path), "--force"], capsys, monkeypatch)
    assert code == 2 and "is a directory" in err
    _trace(tmp_path / "t.jsonl", HEADER, STEP, STEP, STEP)
    code, _, err = run(["plan", "simulate", str(tmp_path / "t.jsonl"), "--out", str(tmp_path)], capsys, monkeypatch)
    assert code == 2 and "--out" in err
    code, _, err = run(["probe", "--out", str(tmp_path)], capsys, monkeypatch)
    assert code == 2 and "--out" in err


def test_probe_arguments_are_checked_before_torch() -> None:
    from glm53.host.probe import check_probe_args

    with pytest.raises(BadInput, match="--block-bytes"):
        check_probe_args(1 << 40, 50, 0)
    with pytest.raises(BadInput, match="--repeats"):
        check_probe_args(1024, 10**9, 0)


@pytest.mark.parametrize(("key", "value"), [("num_hidden_layers", 10**20), ("n_routed_experts", -1)])
def test_model_config_counts_are_bounded(tmp_path: Path, key: str, value: int) -> None:
    from glm53.plan.inputs.model import read_checkpoint_facts

    (tmp_path / "config.json").write_text(
        json.dumps({key: value, "num_hidden_layers": 4, "n_routed_experts": 4} | {key: value})
    )
    with pytest.raises(BadInput, match=key):
        read_checkpoint_facts(tmp_path)
