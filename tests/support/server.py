"""A real vLLM server (CPU) on the generated tiny model, started through `glm53 serve --profile cpu-tiny`.

Used by the session-scoped `vllm_server` fixture: one server per test run. The server runs in its own process
group, so that on teardown every process it started (API server, engine core, workers) can be found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

READY_TIMEOUT_S = float(os.environ.get("GLM53_TEST_SERVER_TIMEOUT", "600"))
STOP_TIMEOUT_S = 60.0


def glm53_executable() -> list[str]:
    """The installed console script next to this Python (the real entry point), else `python -m`."""
    script = Path(sys.executable).with_name("glm53")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "glm53.cli.main"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after its name: state ppid pgrp session ...) of every live process;
    the name may hold spaces, so the fields start after its last ')'."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 4 and fields[0] != "Z":
            yield int(entry.name), fields


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of a session: every process a command started with `start_new_session=True`
    started in turn, whatever process group it put them in (`glm53 serve` runs the engine in a group of its own)."""
    return [pid for pid, fields in _live_processes() if int(fields[3]) == sid]


def signal_session(sid: int, number: int) -> None:
    """Send a signal to every process of a session: a whole box at once, as a power cut would take it."""
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


def children_of(pid: int) -> list[int]:
    """The live children of a process, from /proc."""
    return [child for child, fields in _live_processes() if int(fields[1]) == pid]


@dataclass
class VllmServer:
    base_url: str
    model_name: str
    model_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_seconds: float
    stop_seconds: float | None = None
    leftover: list[int] = field(default_factory=list)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the server's pid (`glm53 serve`, which passes it to vLLM), then wait for its session."""
        pgid = self.process.pid
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while session_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop_seconds = time.monotonic() - started
        self.leftover = session_members(pgid)
        for pid in self.leftover:  # never leave a stray engine behind, even when the check fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def build_tiny_model(model_dir: Path, env: dict[str, str]) -> None:
    """Build, lock and verify the tiny model through the real `glm53 demo --prepare-only`."""
    result = subprocess.run(
        [*glm53_executable(), "demo", "--prepare-only", "--model-dir", str(model_dir)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"glm53 demo --prepare-only failed ({result.returncode}):\n{result.stderr[-4000:]}")


def server_env(workdir: Path) -> dict[str, str]:
    """The environment a server under `workdir` runs in: its own caches, no API key."""
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(workdir / "cache")
    env["HF_HOME"] = str(workdir / "hf")
    env.pop("VLLM_API_KEY", None)
    return env


def start_server(workdir: Path, *, model_name: str = "glm53-tiny") -> VllmServer:
    model_dir = workdir / "tiny"
    build_tiny_model(model_dir, server_env(workdir))
    return serve_model(workdir, model_dir, free_port(), model_name)


def serve_model(
    workdir: Path,
    model_dir: Path,
    port: int,
    model_name: str,
    *,
    log_name: str = "server.log",
    what: str = "the server",
) -> VllmServer:
    """`glm53 serve --profile cpu-tiny` on `model_dir` at `port` (caches and log under `workdir`), returned once its
    /health answers 200; `what` names it in the errors."""
    log_path = workdir / log_name
    argv = [
        *glm53_executable(),
        "serve",
        "--profile",
        "cpu-tiny",
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
        "--set",
        f"SERVED_MODEL_NAME={model_name}",
    ]
    base_url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            env=server_env(workdir),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = VllmServer(
        base_url=base_url,
        model_name=model_name,
        model_dir=model_dir,
        process=process,
        log_path=log_path,
        ready_seconds=0.0,
    )
    deadline = started + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            server.stop()
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready:\n{server.log_tail()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{what} was not ready after {READY_TIMEOUT_S:.0f} s:\n{server.log_tail()}")
        time.sleep(0.5)
    server.ready_seconds = time.monotonic() - started
    return server
