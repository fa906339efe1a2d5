"""What `glm53 serve` says while an engine starts, and how it runs the engine as its child: each stage once
with its time, the engine's own output passed through, signals passed on once, the engine never outliving
glm53, and glm53 ending as the engine did.

The stages are read from the engines' real output: vLLM 0.32's log of a CPU start (fixtures/serve, recorded
from `glm53 serve --profile cpu-tiny`; the real server's own start is checked in test_server_e2e), and a
TabbyAPI double that prints TabbyAPI's and ExLlamaV3's lines (the forms seen on the H200 serve of
docs/serve.md, from backends/exllamav3/model.py at e632af41 and ExLlamaV3 1.4.6's block_sparse_mlp_cpu.py),
answers GET /health as TabbyAPI does, and records every signal it gets.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from glm53.serve.engines.exllamav3 import EXL3_START_STAGES
from glm53.serve.engines.vllm import VLLM_START_STAGES
from glm53.serve.progress import StageWatcher, parse_stage_line, stage_line
from tests.support.server import free_port, session_members
from tests.support.tabby_rig import GLM53_MAIN, TabbyRig

VLLM_LOG = (Path(__file__).parent / "fixtures" / "serve" / "vllm-0.32-cpu-start.log").read_text()
VLLM_STAGES = ["engine core", "model load", "KV cache and warm-up", "API server"]

TABBY_DOUBLE = textwrap.dedent("""
    # A TabbyAPI double: TabbyAPI's and ExLlamaV3's start lines, GET /health, every signal recorded.
    import http.server, json, os, signal, sys, threading, time
    config = sys.argv[sys.argv.index("--config") + 1]
    network = json.load(open(config))["network"]
    report = os.environ["STAND_IN_REPORT"]
    seen = {"pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid(), "signals": []}

    def save():
        with open(report + ".tmp", "w") as out:
            json.dump(seen, out)
        os.replace(report + ".tmp", report)

    def log(message):
        print(time.strftime("%Y-%m-%d %H:%M:%S.000") + " INFO:     " + message, flush=True)

    def on_signal(number, frame):
        seen["signals"].append(number)
        save()
        if number == signal.SIGTERM or len(seen["signals"]) > 1:
            log("Shutting down")
            os._exit(int(os.environ.get("STAND_IN_EXIT", "0")))

    def on_sigint(number, frame):
        on_signal(number, frame)
        threading.Timer(1.0, lambda: os._exit(130)).start()  # uvicorn's graceful stop, after any second Ctrl-C

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_sigint)
    save()
    log("Loading model: " + os.path.dirname(config))
    print(" -- CPU split experts (worker, dynamic): model.layers.3.mlp", flush=True)
    print("Loading model modules \\r 50%\\r100%", file=sys.stderr, flush=True)
    if os.environ.get("STAND_IN_DIE"):
        os.kill(os.getpid(), signal.SIGKILL)
    log("Model successfully loaded.")

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "healthy", "issues": []}).encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((network["host"], network["port"]), Health)
    log(f"Uvicorn running on http://{network['host']}:{network['port']} (Press CTRL+C to quit)")
    server.serve_forever()
""")


def test_vllms_real_start_log_gives_its_four_stages_in_order() -> None:
    watcher = StageWatcher(VLLM_START_STAGES)
    reached = watcher.feed(VLLM_LOG, 1.0)
    assert [stage.stage for stage in reached] == VLLM_STAGES
    assert watcher.feed(VLLM_LOG, 2.0) == []  # each stage once


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(VLLM_LOG) - 1), max_size=40))
def test_any_chunking_of_the_output_gives_the_same_stages(cuts: list[int]) -> None:
    # Pipes deliver output in pieces that split lines anywhere; the stages do not depend on where.
    bounds = [0, *sorted(set(cuts)), len(VLLM_LOG)]
    watcher = StageWatcher(VLLM_START_STAGES)
    for start, end in itertools.pairwise(bounds):
        watcher.feed(VLLM_LOG[start:end], 1.0)
    watcher.finish(2.0)
    assert [stage.stage for stage in watcher.reached] == VLLM_STAGES


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=2000))
def test_hostile_output_never_breaks_the_watcher(text: str) -> None:
    watcher = StageWatcher(EXL3_START_STAGES)
    watcher.feed(text, 0.5)
    watcher.finish(1.0)
    assert len(watcher.reached) == len({stage.stage for stage in watcher.reached})


def test_a_stage_line_reads_back_as_what_was_printed() -> None:
    line = stage_line("engine load", 104.25, "every layer loaded")
    parsed = parse_stage_line(line)
    assert parsed is not None and (parsed.stage, parsed.seconds, parsed.detail) == (
        "engine load",
        104.2,
        "every layer loaded",
    )
    assert parse_stage_line("glm53 start: soon") is None


def _start(rig: TabbyRig, *flags: str, **extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", GLM53_MAIN, *rig.args(), *flags],
        env=rig.env(**extra),
        cwd=rig.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _healthy(rig: TabbyRig, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"http://127.0.0.1:{rig.port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the TabbyAPI double did not answer /health")


def _gone(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_members(process.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left: {left}"


def _report(rig: TabbyRig) -> dict[str, object]:
    return dict(json.loads(rig.report.read_text()))


def test_each_stage_of_a_tabbyapi_start_is_reported_once_in_order(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, TABBY_DOUBLE, port=free_port())
    process = _start(rig)
    try:
        _healthy(rig, process)
        time.sleep(1.0)  # the supervisor polls /health every 0.5 s
        seen = _report(rig)
        assert seen["ppid"] == process.pid and seen["pgid"] == seen["pid"] != process.pid  # a child, its own group
        process.send_signal(signal.SIGTERM)  # as systemd or a container runtime stops it
        out, err = (stream.decode() for stream in process.communicate(timeout=30))
    finally:
        _gone(process)
    assert process.returncode == 0, err
    assert _report(rig)["signals"] == [signal.SIGTERM]  # passed on once
    stages = [stage for stage in map(parse_stage_line, err.splitlines()) if stage is not None]
    assert [stage.stage for stage in stages] == [
        "plan",
        "config",
        "engine started",
        "imports",
        "CPU worker",
        "engine load",
        "API server",
        "first health",
    ]
    assert [stage.seconds for stage in stages] == sorted(stage.seconds for stage in stages)
    assert stages[-1].detail == f"GET http://127.0.0.1:{rig.port}/health answered 200: serving"
    # The engine's own output is passed through whole, on the stream it wrote it to.
    assert "Model successfully loaded." in out and "Shutting down" in out
    assert "Loading model modules \r 50%\r" in err and "100%\n" in err  # a progress bar's returns kept


def test_a_ctrl_c_reaches_the_engine_once(tmp_path: Path) -> None:
    # A terminal's Ctrl-C signals its foreground process group, which is glm53's: the engine, in a group of its
    # own, gets it from glm53 alone, once (twice would make uvicorn skip its graceful shutdown).
    rig = TabbyRig(tmp_path, TABBY_DOUBLE, port=free_port())
    process = _start(rig)
    try:
        _healthy(rig, process)
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=30)
    finally:
        _gone(process)
    assert _report(rig)["signals"] == [signal.SIGINT]
    assert process.returncode == 130  # the engine's own exit code


def test_the_engine_does_not_outlive_a_killed_glm53(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, TABBY_DOUBLE, port=free_port())
    process = _start(rig)
    try:
        _healthy(rig, process)
        engine = int(str(_report(rig)["pid"]))
        process.kill()  # SIGKILL: glm53 cannot pass anything on
        process.communicate(timeout=30)
        _gone(process, timeout=15)
    finally:
        _gone(process)
    # From the kernel at its parent's death: once per thread of glm53 that the orphan is handed to on the way
    # out (Linux reparents it to a live thread of the same process and signals it again), so one or more.
    got = _report(rig)["signals"]
    assert isinstance(got, list) and got and set(got) == {signal.SIGTERM}
    assert engine not in session_members(process.pid)  # gone (a zombie at most, until init reaps it)


def test_glm53_ends_as_the_engine_did(tmp_path: Path) -> None:
    rig = TabbyRig(tmp_path, TABBY_DOUBLE, port=free_port())
    died = _start(rig, STAND_IN_DIE="1")
    err = died.communicate(timeout=60)[1].decode()
    _gone(died)
    assert died.returncode == -signal.SIGKILL, err  # killed by the same signal, as a shell or systemd sees it
    assert "engine load" not in err and "first health" not in err  # no stage it did not reach

    exits = _start(rig, STAND_IN_EXIT="7")
    try:
        _healthy(rig, exits)
        exits.send_signal(signal.SIGTERM)
        exits.communicate(timeout=30)
    finally:
        _gone(exits)
    assert exits.returncode == 7
