"""SIGTERM to a long command, as systemd, a container runtime or `kill` sends it: the command ends, and leaves
no process (workers, git and its helpers) and no temp file behind. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import glm53
from glm53.plan.routing.traces import SyntheticTraceSpec, synthesize_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
SOURCE = str(Path(glm53.__file__).resolve().parents[1])


def _children(pid: int) -> dict[int, int]:
    """pid -> parent pid of every live process on this host."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = int(fields[1])
    return table


def _descendants(pid: int) -> set[int]:
    table = _children(pid)
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    live = _children(0)
    return {pid for pid in pids if pid in live}


def _start(args: list[str], tmp: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": SOURCE, "TMPDIR": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-m", "glm53.cli.main", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=tmp,
    )


def _terminate_when(process: subprocess.Popen[bytes], ready: int, *, within: float = 60.0) -> tuple[set[int], str]:
    """Once the command has `ready` descendants, SIGTERM the command alone (not its group) and wait for it.
    Returns every descendant seen while it ran, and its stderr."""
    seen: set[int] = set()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and process.poll() is None:
        seen |= _descendants(process.pid)
        if len(_alive(seen)) >= ready:
            break
        time.sleep(0.05)
    assert process.poll() is None, f"finished before it was signalled: {process.stderr.read().decode()}"  # type: ignore[union-attr]
    assert len(_alive(seen)) >= ready, f"only {len(seen)} children after {within:.0f} s"
    time.sleep(0.3)  # let the workers get busy
    seen |= _descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("still running 30 s after SIGTERM")
    return seen, err.decode(errors="replace")


def _no_leftovers(seen: set[int], tmp: Path) -> None:
    deadline = time.monotonic() + 5
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(seen), f"processes left after SIGTERM: {_alive(seen)}"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Big enough that planning spreads over processes (glm53.plan.parallel.SMALL_WORK) and runs for seconds.
    path = tmp_path_factory.mktemp("trace") / "routing.npz"
    write_trace(path, synthesize_trace(SyntheticTraceSpec(steps=8000)))
    return path


def _files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def test_sigterm_ends_plan_simulate_and_its_workers(trace: Path, tmp_path: Path) -> None:
    process = _start(["plan", "simulate", str(trace), "--workers", "2", "--out", "report.json"], tmp_path)
    seen, err = _terminate_when(process, ready=2)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
    _no_leftovers(seen, tmp_path)
    assert _files(tmp_path) == set()  # neither the report nor a temp file


def test_sigterm_ends_plan_with_stats_and_leaves_no_temp_file(trace: Path, tmp_path: Path) -> None:
    host = ROOT / "tests" / "fixtures" / "hosts" / "threadripper-5975wx-cgv2"
    args = [
        "plan",
        "host",
        "--gpu-memory",
        "24GiB,24GiB",
        "--host-root",
        str(host),
        "--stats",
        str(trace),
        "--out",
        "D",
    ]
    process = _start(args, tmp_path)
    seen, err = _terminate_when(process, ready=2)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
    _no_leftovers(seen, tmp_path)
    assert not [name for name in _files(tmp_path) if name.endswith(".tmp")]
    assert not (tmp_path / "D" / "plan.json").exists()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTP address that accepts connections and never answers: git waits on it until it is killed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for connection in held:
            connection.close()


def test_sigterm_during_repro_resolve_kills_git_and_removes_its_temp_dir(silent_server: str, tmp_path: Path) -> None:
    lock = tmp_path / "repro.lock.json"
    data = json.loads((ROOT / "repro.lock.json").read_text())
    data["engine"]["vllm"] |= {"url": f"{silent_server}/vllm.git", "short_rev": "8e685d198", "rev": None, "hash": None}
    lock.write_text(json.dumps(data, indent=2))
    process = _start(["repro", "resolve", "--lock", str(lock), "--yes", "--timeout", "120"], tmp_path)
    # git and its remote helper: the fetch is under way, and its temp dir exists.
    seen, err = _terminate_when(process, ready=2)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
    _no_leftovers(seen, tmp_path)
    assert _files(tmp_path) == {"repro.lock.json"}  # no glm53-resolve-* directory
    assert json.loads(lock.read_text()) == data
