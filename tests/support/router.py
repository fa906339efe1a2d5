"""The real vllm-router for the tests: whether it is installed beside this Python, and a router process started,
waited on until it answers and stopped with SIGTERM (tests/test_router.py, tests/test_fleet_router.py)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROUTER_INSTALLED = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) is not None
NOT_INSTALLED = "vllm-router is not installed (pip install .[dev])"
needs_router = pytest.mark.skipif(not ROUTER_INSTALLED, reason=NOT_INSTALLED)


def log_tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_router(argv: list[str], url: str, log: Path, *, ready_s: float = 60.0) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (the router, or `glm53 router` starting it) in its own session with its output in `log`; yields
    the process once `url`/v1/models answers 200, and on exit stops it (SIGTERM, then SIGKILL after 20 s)."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the router exited with {process.returncode}:\n{log_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router was not ready:\n{log_tail(log)}")
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
