"""End to end on a real vLLM server (CPU backend, tiny generated model) started by `glm53 serve --profile cpu-tiny`.

The server is the session's `vllm_server` fixture; its teardown sends SIGTERM and fails if any process is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from glm53.serve.demo import sample_body
from glm53.serve.progress import parse_stage_line
from tests.support.server import VllmServer, children_of, free_port, glm53_executable, session_members

pytestmark = pytest.mark.slow

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _chat(server: VllmServer, **body: object) -> dict[str, object]:
    payload = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 16,
        "temperature": 0,
    } | body
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=120)
    assert response.status_code == 200, response.text
    data: dict[str, object] = response.json()
    return data


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_health_and_models(vllm_server: VllmServer) -> None:
    assert httpx.get(f"{vllm_server.base_url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()
    ids = [m["id"] for m in models["data"]]
    assert ids == [vllm_server.model_name]
    assert models["data"][0]["max_model_len"] == 4096  # cpu-tiny's MAX_MODEL_LEN reached vLLM
    assert models["data"][0]["root"] == str(vllm_server.model_dir.resolve())


def test_serve_runs_vllm_as_its_one_child_and_reports_each_stage(vllm_server: VllmServer) -> None:
    # `glm53 serve` runs vLLM's CLI as its only child, in a process group of its own (a terminal's Ctrl-C reaches
    # glm53 alone, which passes it on once), with the launch's environment.
    (child,) = children_of(vllm_server.process.pid)
    argv = _cmdline(child)
    assert "glm53.serve.launcher" in argv and "serve" in argv
    assert "--enforce-eager" in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert os.getpgid(child) == child != os.getpgid(vllm_server.process.pid)
    env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
    assert b"VLLM_CPU_KVCACHE_SPACE=1" in env and b"HF_HUB_OFFLINE=1" in env
    # Each stage of the start once, in order, with its time, read from what the start printed. glm53 polls
    # /health on its own (every 0.5 s), so its last line may follow the fixture's own first 200 by a moment.
    deadline = time.monotonic() + 10
    while "first health:" not in vllm_server.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    stages = [s for s in map(parse_stage_line, vllm_server.log_path.read_text(errors="replace").splitlines()) if s]
    names = [stage.stage for stage in stages]
    assert names == [
        "plan",
        "config",
        "engine started",
        "engine core",
        "model load",
        "KV cache and warm-up",
        "API server",
        "first health",
    ], names
    seconds = [stage.seconds for stage in stages]
    assert seconds == sorted(seconds) and seconds[-1] <= vllm_server.ready_seconds + 1.0
    assert stages[2].detail.startswith(f"pid {child}:")


def test_chat_completion(vllm_server: VllmServer) -> None:
    data = _chat(vllm_server, max_tokens=12)
    choice = data["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] in ("length", "stop")
    message = choice["message"]
    # Random weights: the text is noise, and glm45 puts it in `reasoning` (the template opens <think>).
    assert message["role"] == "assistant"
    assert (message.get("content") or "") + (message.get("reasoning") or "")
    usage = data["usage"]  # type: ignore[index]
    assert usage["completion_tokens"] <= 12 and usage["prompt_tokens"] > 0


def test_streaming_completion_with_usage(vllm_server: VllmServer) -> None:
    payload = {
        "model": vllm_server.model_name,
        "prompt": "The quick brown fox",
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "skip_special_tokens": False,
    }
    chunks: list[dict[str, object]] = []
    with httpx.stream("POST", f"{vllm_server.base_url}/v1/completions", json=payload, timeout=120) as response:
        assert response.status_code == 200
        done = False
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            body = line.removeprefix("data: ")
            if body == "[DONE]":
                done = True
                break
            chunks.append(json.loads(body))
    assert done
    # Tokens arrive one event at a time (random weights may emit text that decodes to "", e.g. half a UTF-8
    # character, so count events rather than characters).
    token_events = [c for c in chunks if c.get("choices")]
    assert len(token_events) >= 2
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 10  # type: ignore[index]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]  # type: ignore[index]
    assert finish[-1] == "length"


def test_streaming_chat(vllm_server: VllmServer) -> None:
    payload = {
        "model": vllm_server.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    deltas = 0
    with httpx.stream("POST", f"{vllm_server.base_url}/v1/chat/completions", json=payload, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                delta = event["choices"][0]["delta"] if event["choices"] else {}
                deltas += bool(delta.get("content") or delta.get("reasoning"))
    assert deltas > 0


def test_tool_call_named_function_through_glm47(vllm_server: VllmServer) -> None:
    # A named tool choice forces a call; the reply's structure is what an OpenAI client parses.
    data = _chat(
        vllm_server,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=48,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        chat_template_kwargs={"enable_thinking": False},
    )
    message = data["choices"][0]["message"]  # type: ignore[index]
    calls = message["tool_calls"]
    assert len(calls) == 1
    call = calls[0]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_tool_choice_auto_is_parsed_by_glm47(vllm_server: VllmServer) -> None:
    # With tool_choice=auto the glm47 parser reads the output; random weights may or may not call the tool,
    # but the reply must be well formed either way.
    data = _chat(
        vllm_server,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=32,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    message = data["choices"][0]["message"]  # type: ignore[index]
    for call in message.get("tool_calls") or []:
        assert call["function"]["name"] == "get_weather"
        json.loads(call["function"]["arguments"])
    assert data["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")  # type: ignore[index]


def test_server_ready_time_is_recorded(vllm_server: VllmServer) -> None:
    assert 0 < vllm_server.ready_seconds < 600


def test_demo_serves_and_ctrl_c_stops_it_cleanly(vllm_server: VllmServer, tmp_path: Path) -> None:
    # `glm53 demo` on the fixture's (already built and locked) model: verified again, served through
    # `serve --profile cpu-tiny`, then Ctrl-C (SIGINT to the foreground process group) stops everything.
    env = dict(os.environ)
    # The server's cache: its flag check is reused (the port is not part of the key).
    env["XDG_CACHE_HOME"] = str(vllm_server.model_dir.parent / "cache")
    port = free_port()
    log = tmp_path / "demo.log"
    argv = [
        *glm53_executable(),
        "demo",
        "--model-dir",
        str(vllm_server.model_dir),
        "--port",
        str(port),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        text = log.read_text(errors="replace")
        assert "model found" in text and "match the lock" in text
        assert "serve parser (cached)" in text  # the server's check, reused on another port
        assert f"curl -s http://127.0.0.1:{port}/v1/chat/completions" in text
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "glm53-tiny"
        # The sample request the demo prints: its answer is readable as the message's content (thinking off).
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=sample_body("glm53-tiny"), timeout=120
        ).json()
        assert isinstance(answer["choices"][0]["message"]["content"], str), answer
        assert answer["choices"][0]["message"]["content"].strip()
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while session_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_members(process.pid) == []
        _assert_quiet_stop(log.read_text(errors="replace"))
    finally:
        for pid in session_members(process.pid):
            os.kill(pid, signal.SIGKILL)


def _assert_quiet_stop(text: str) -> None:
    """What a Ctrl-C leaves in the terminal: vLLM's shutdown lines, no traceback and no leak reports."""
    tail = text[text.find("starting vLLM") :]
    for noise in ("Traceback", "KeyboardInterrupt", "nanobind", "leaked", "resource_tracker", "EngineDeadError"):
        assert noise not in tail, f"{noise!r} after Ctrl-C:\n{tail[-3000:]}"


def test_ctrl_c_while_the_demo_starts_is_quiet(vllm_server: VllmServer, tmp_path: Path) -> None:
    # Ctrl-C while vLLM is still starting (its engine core being spawned): one line, exit 130, nothing left.
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(vllm_server.model_dir.parent / "cache")
    log = tmp_path / "demo.log"
    argv = [*glm53_executable(), "demo", "--model-dir", str(vllm_server.model_dir), "--port", str(free_port())]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        # vLLM logs its arguments once it runs, then spawns the engine core: interrupt in between.
        while "non-default args" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        os.killpg(process.pid, signal.SIGINT)
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            # vLLM's asyncio startup can absorb a first Ctrl-C (it only cancels a task); a second one, as a
            # user presses it, stops the server (docs/serve.md). Either way the stop must be quiet.
            os.killpg(process.pid, signal.SIGINT)
            code = process.wait(timeout=120)
        deadline = time.monotonic() + 30
        while session_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_members(process.pid) == []
        text = log.read_text(errors="replace")
        if "Application startup complete" not in text:
            assert code == 130, text[-3000:]
            assert "interrupted: vLLM stopped before it was ready" in text
        _assert_quiet_stop(text)
    finally:
        for pid in session_members(process.pid):
            os.kill(pid, signal.SIGKILL)
