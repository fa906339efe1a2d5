"""`glm53 serve --capture-routing`: the recorder runs TabbyAPI's main.py with ExLlamaV3's routing recorded.

ExLlamaV3 needs CUDA, so these run the recorder on a stand-in package (tests/fixtures/exl3-standin; its
docstring says what it models) in a real child process, as `glm53 serve` execs it. The placement rule is held to
the real engine's record in tests/test_exl3_capture.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from glm53.errors import BadInput
from glm53.plan.exllamav3.capture import compare_capture, load_capture
from glm53.plan.routing.traces import read_trace
from glm53.recipe.profiles import load_profile
from glm53.serve.engines.exllamav3.tabby import build_tabby_launch, tabby_main
from glm53.serve.launch import LaunchSpec
from glm53.serve.resolve import ServeRequest, resolve_launch

STAND_IN = Path(__file__).parent / "fixtures" / "exl3-standin"
SOURCE = Path(__file__).parents[1] / "python" / "src"


def _record(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(SOURCE), str(STAND_IN)]),
        **env,
    }
    argv = [sys.executable, "-m", "glm53.serve.engines.exllamav3.routing", "--out", str(out)]
    main = STAND_IN / "tabby" / "main.py"
    return subprocess.run(
        [*argv, str(main), "--config", "/run/glm53/config.yml"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_recorder_runs_the_program_as_its_own_main_and_writes_the_capture(tmp_path: Path) -> None:
    done = _record(tmp_path / "capture", EXL3_MOE_CPU_SWAP_INTERVAL="2")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.splitlines()[-1])
    # main.py sees its own argv and imports its own packages, and torch was not imported ahead of it
    assert shown["argv"] == [str(STAND_IN / "tabby" / "main.py"), "--config", "/run/glm53/config.yml"]
    assert shown["probe"] == "tabby-common" and shown["torch_before_exllamav3"] is False
    capture = load_capture(tmp_path / "capture" / "capture.npz")
    assert capture.calls == 3 * 12  # 3 jobs of a prefill and 11 decode steps: the measuring pass is not counted
    assert capture.drained_after == (11, 23, 35)
    assert capture.split_layers == (2, 3) and capture.cpu_experts == (8, 8)
    tokens = {layer.layer: len(layer.routes) for layer in capture.layers}
    assert tokens == {1: 3 * (5 + 11), 2: 3 * (5 + 11), 3: 3 * 11}  # the last layer routes no prefill
    result = compare_capture(capture)
    assert result.trigger_agrees and result.sweeps > 0 and result.agree
    assert {inline for _, inline in result.recorded_sweeps} == {True, False}  # both paths of the trigger
    assert len(capture.sweep_seconds) == result.sweeps and all(seconds >= 0 for seconds in capture.sweep_seconds)
    trace = read_trace(tmp_path / "capture" / "routing.npz")
    assert trace.layers == (1, 2, 3) and trace.steps == 3 * 11
    assert np.array_equal(trace.routes[:, 2], capture.layers[2].routes)


def test_a_drain_before_any_decode_step_is_reported_and_serving_goes_on(tmp_path: Path) -> None:
    done = _record(tmp_path / "capture", EXL3_MOE_CPU_SWAP_INTERVAL="2", STANDIN_JOBS="0,11")
    assert done.returncode == 0, done.stderr
    assert "no one-token pass that every layer routed" in done.stderr
    capture = load_capture(tmp_path / "capture" / "capture.npz")
    assert capture.calls == 1 + 12 and capture.drained_after == (0, 12)
    assert read_trace(tmp_path / "capture" / "routing.npz").steps == 11
    assert compare_capture(capture).agree


def _launch(tmp_path: Path, directory: str = "routing") -> LaunchSpec:
    return build_tabby_launch(
        load_profile("exl3-1gpu", environ={}),
        model_dir=tmp_path,
        host="127.0.0.1",
        port=8011,
        listen_all=False,
        plan=None,
        api_key=False,
        environ={"GLM53_TABBYAPI_DIR": str(STAND_IN / "tabby"), "XDG_RUNTIME_DIR": str(tmp_path)},
        python=sys.executable,
        capture_routing=tmp_path / directory,
    )


def test_serve_puts_the_recorder_in_front_of_tabbyapi(tmp_path: Path) -> None:
    spec = _launch(tmp_path)
    main = str(STAND_IN / "tabby" / "main.py")
    assert spec.argv[:5] == [
        sys.executable,
        "-m",
        "glm53.serve.engines.exllamav3.routing",
        "--out",
        str(tmp_path / "routing"),
    ]
    assert tabby_main(spec.argv) == main and spec.argv[5:7] == [main, "--config"]
    assert spec.origins["argv"].endswith("--capture-routing")


@pytest.mark.parametrize("existing", ["capture.npz", "routing.npz"])
def test_an_earlier_capture_is_never_replaced(tmp_path: Path, existing: str) -> None:
    (tmp_path / "routing").mkdir()
    (tmp_path / "routing" / existing).write_bytes(b"earlier")
    with pytest.raises(BadInput, match=f"already holds {existing}"):
        _launch(tmp_path)
    assert (tmp_path / "routing" / existing).read_bytes() == b"earlier"


def test_a_capture_directory_that_cannot_be_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("kept")
    with pytest.raises(BadInput, match="a-file is not a directory"):
        _launch(tmp_path, "a-file")
    with pytest.raises(BadInput, match="its parent directory does not exist"):
        _launch(tmp_path, "missing/routing")
    assert (tmp_path / "a-file").read_text() == "kept" and not (tmp_path / "missing").exists()


def test_a_vllm_profile_refuses_the_capture(tmp_path: Path) -> None:
    request = ServeRequest(profile="cpu-tiny", model_dir=tmp_path, capture_routing=tmp_path / "routing")
    with pytest.raises(BadInput, match="--capture-routing records ExLlamaV3's routing; cpu-tiny runs on vllm"):
        resolve_launch(request, environ={})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_a_capture_directory_this_user_cannot_write_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(BadInput, match="is not writable by this user"):
            _launch(tmp_path, "locked/routing")
    finally:
        locked.chmod(0o700)
