"""Run the engine as this command's child and say what its start is doing: `glm53 serve` without `--exec`.

The engine's output is passed through as it comes (whole lines; a progress bar's carriage returns kept), and
each of its stages (`glm53.serve.progress`) is reported once on stderr with its time, up to the first 200 from
GET /health. The child is the engine exactly as `--exec` would run it (argv, environment, working directory,
CPU affinity), with stdin from /dev/null, in a process group of its own within glm53's session.

Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 that reach glm53 (a terminal's Ctrl-C, systemd,
a container runtime, `kill`) are passed to the engine's main process once. Its own group is why once: a
terminal's Ctrl-C goes to the foreground group only, which is glm53's, so the engine does not get it twice (a
second SIGINT makes uvicorn skip its graceful shutdown, and vLLM's engine core leaves SIGINT to its API server).
systemd's stop signals every process of the unit's cgroup, so there the engine also gets SIGTERM directly:
a second SIGTERM changes nothing in uvicorn. The engine gets SIGTERM if glm53 dies first (PR_SET_PDEATHSIG),
so it never outlives the command. glm53 ends as the engine did: its exit code, or the same signal.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import IO, NoReturn

from glm53.errors import Unavailable
from glm53.serve.exec import EngineProcess, apply_affinity
from glm53.serve.progress import FIRST_HEALTH, StageMarker, StageWatcher, stage_line

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1  # include/uapi/linux/prctl.h
HEALTH_INTERVAL_S = 0.5
# After the engine exits, how long its output may still drain (a process it started may hold the pipe).
DRAIN_TIMEOUT_S = 5.0


class StartReporter:
    """Stage lines and the engine's relayed output go through one lock, so no line is split by another."""

    def __init__(self, started: float, write_err: Callable[[bytes], None]) -> None:
        self.started = started
        self.lock = threading.Lock()
        self._write_err = write_err

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def stage(self, name: str, detail: str) -> None:
        with self.lock:
            self._write_err((stage_line(name, self.seconds(), detail) + "\n").encode())


def write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BrokenPipeError:
                return  # nobody reads this output any more; the engine keeps running
            except InterruptedError:
                continue

    return write


def _in_child(parent: int) -> None:
    """In the forked child before the exec: signals unblocked (the mask survives exec), and SIGTERM when the
    parent dies."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _relay(
    source: IO[bytes],
    write: Callable[[bytes], None],
    watcher: StageWatcher,
    reporter: StartReporter,
) -> None:
    """Pass the engine's output on, a whole line at a time, and report the stages it completes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = b""
    fd = source.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if chunk:
            data = held + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            complete, held = data[:cut], data[cut:]
        else:
            complete, held = held, b""
        with reporter.lock:
            if complete:
                write(complete)
            reached = watcher.feed(decoder.decode(complete, final=not chunk), reporter.seconds())
            if not chunk:
                reached += watcher.finish(reporter.seconds())
        for stage in reached:
            reporter.stage(stage.stage, stage.detail)
        if not chunk:
            return


def _poll_health(url: str, reporter: StartReporter, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                if response.status == 200:
                    reporter.stage(FIRST_HEALTH, f"GET {url} answered 200: serving")
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        stop.wait(HEALTH_INTERVAL_S)


def supervise(
    process: EngineProcess,
    markers: tuple[StageMarker, ...],
    health_url: str,
    reporter: StartReporter,
) -> int:
    """Run the engine to its end; its return code (negative: the signal that ended it)."""
    apply_affinity(process.cpu_affinity)  # inherited by the child; refused here, before anything starts
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    parent = os.getpid()
    try:
        child = subprocess.Popen(  # argv from the resolved launch, never a shell
            process.argv,
            executable=process.program,
            env=process.env,
            cwd=process.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            preexec_fn=lambda: _in_child(parent),  # no thread of this process runs yet
        )
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise Unavailable(f"cannot start {process.program}: {exc.strerror}") from exc
    assert child.stdout is not None and child.stderr is not None
    reporter.stage("engine started", f"pid {child.pid}: {os.path.basename(process.program)}")
    watcher = StageWatcher(markers)
    stop = threading.Event()
    threads = [
        threading.Thread(target=_relay, args=(child.stdout, write_all(1), watcher, reporter), daemon=True),
        threading.Thread(target=_relay, args=(child.stderr, write_all(2), watcher, reporter), daemon=True),
        threading.Thread(target=_poll_health, args=(health_url, reporter, stop), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        while child.poll() is None:
            info = signal.sigtimedwait(FORWARDED, 0.25)
            if info is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(info.si_signo)
    finally:
        stop.set()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return child.returncode


def end_like(returncode: int) -> NoReturn:
    """Exit as the engine did: its code, or killed by the same signal (what systemd and a shell then see)."""
    if returncode >= 0:
        raise SystemExit(returncode)
    number = -returncode
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler and no mask
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
    os.kill(os.getpid(), number)
    raise SystemExit(128 + number)  # a signal whose default is not to end the process


__all__ = ["FORWARDED", "StartReporter", "end_like", "supervise", "write_all"]
