"""What every engine's start shares: the API key read from its file, the CPU affinity pinned, the process it
runs (`EngineProcess`), exec'd in place with `--exec` or run as glm53's child (`glm53.serve.supervise`).

The API key is read from a file and passed in the environment only (VLLM_API_KEY, or TabbyAPI's private key
file); it is never put into argv (visible in /proc/PID/cmdline) nor printed.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import read_text_bounded

API_KEY_MAX_BYTES = 64 * 1024


def read_api_key(path: Path) -> str:
    """The first line of `path`, stripped. A missing, unreadable, empty, world-readable or non-regular file
    (a pipe would block) is bad input."""
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise BadInput(f"--api-key-file: {path} not found") from exc
    except OSError as exc:
        raise BadInput(f"--api-key-file: cannot read {path}: {exc.strerror}") from exc
    if stat.S_ISREG(info.st_mode) and info.st_mode & stat.S_IROTH:
        raise BadInput(f"--api-key-file: {path} is readable by every user", fix=f"chmod 600 {path}")
    raw = read_text_bounded(path, what="--api-key-file", max_bytes=API_KEY_MAX_BYTES)
    key = raw.strip().splitlines()[0].strip() if raw.strip() else ""
    if not key:
        raise BadInput(f"--api-key-file: {path} is empty", fix="write the key on the first line")
    return key


def api_key_file_warning(path: Path) -> str | None:
    """A key file other users of its group can read works, but deserves a word."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if mode & stat.S_IRGRP:
        return f"--api-key-file: {path} is readable by its group; chmod 600 {path} keeps the key to its owner"
    return None


def apply_affinity(cpus: list[int] | None) -> None:
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        allowed = sorted(os.sched_getaffinity(0))
        raise BadInput(
            f"cannot pin vLLM to CPUs {cpus}: {exc.strerror}",
            fix=f"this process may use CPUs {allowed}; re-run `glm53 plan host` on this machine",
        ) from exc


def find_program(program: str, env: dict[str, str], *, fix: str) -> str:
    """The program as a path: a bare name looked up on the launch's PATH (os.execve and Popen's `executable`
    do not search it); Unavailable naming it and `fix` when it is not there."""
    if os.sep in program:
        return program
    found = shutil.which(program, path=env.get("PATH"))
    if found is None:
        raise Unavailable(f"{program} not found on PATH", fix=fix)
    return found


@dataclass(frozen=True)
class EngineProcess:
    """What a start runs: the program (a path, found on the launch's PATH), its argv, environment, working
    directory and CPU affinity, the same whether glm53 execs it or runs it as its child."""

    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    cpu_affinity: list[int] | None


def exec_in_place(process: EngineProcess) -> NoReturn:
    """Replace this process with the engine: its PID, and every signal straight to it."""
    if process.cwd is not None:
        os.chdir(process.cwd)
    apply_affinity(process.cpu_affinity)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(process.program, process.argv, process.env)
