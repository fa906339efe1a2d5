"""Shared fixtures. Every test gets its own cache and Hugging Face state, never the user's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import VllmServer, start_server


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_CACHE_HOME", str(state / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(state / "state"))
    monkeypatch.setenv("HF_HOME", str(state / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return state


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM server (CPU, tiny generated model) for the whole run, started by `glm53 serve --profile
    cpu-tiny`. Yields .base_url, .model_name, .model_dir, .process; on teardown sends SIGTERM and fails if any
    process of the server is left. Tests using it are marked `slow`."""
    server = start_server(tmp_path_factory.mktemp("vllm-server"))
    sys.stderr.write(f"\n[vllm_server] ready in {server.ready_seconds:.1f} s at {server.base_url}\n")
    try:
        yield server
    finally:
        server.stop()
        sys.stderr.write(f"\n[vllm_server] stopped in {server.stop_seconds or 0:.1f} s\n")
    if server.leftover:
        pytest.fail(f"processes left after SIGTERM to the server: {server.leftover}\n{server.log_tail()}")
