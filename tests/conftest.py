"""Shared fixtures. Every test gets its own cache and Hugging Face state, never the user's."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.recipe.profiles import KEYS
from tests.support.server import VllmServer, start_server

# Variables of the test run itself, not of glm53: they pass through.
TEST_CONTROLS = frozenset({"GLM53_UPDATE_GOLDEN"})
# What glm53 reads from the environment besides the profile keys and GLM53_*: the Hub's endpoint, the CUDA driver
# override, systemd's runtime directory and the XDG runtime directory (where launches write their config), the API
# key vLLM reads.
READ_BY_GLM53 = ("HF_ENDPOINT", "TRITON_LIBCUDA_PATH", "RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR", "VLLM_API_KEY")


def caller_variables(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """The variables of the caller's shell that would change what glm53 does: every profile key (a profile reads
    them as overrides), every GLM53_* setting and the others glm53 reads."""
    return sorted(
        name
        for name in environ
        if name in KEYS or name in READ_BY_GLM53 or (name.startswith("GLM53_") and name not in TEST_CONTROLS)
    )


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts from a clean environment: the caller's profile keys and GLM53_* settings are cleared (a
    test that wants one sets it), and the caches and Hub state are the test's own."""
    for name in caller_variables(os.environ):
        monkeypatch.delenv(name)
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
