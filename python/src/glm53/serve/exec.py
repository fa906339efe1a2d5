"""Carry out a LaunchSpec: export its environment, pin the CPUs, and replace this process with vLLM.

`os.execvpe` (not a child process): signals from systemd, Docker or Ctrl-C reach vLLM directly, and no glm53
wrapper process is left. The API key is read from a file and passed in VLLM_API_KEY only; it is never put into
argv (visible in /proc/PID/cmdline) nor printed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_bytes, read_text_bounded
from glm53.serve.launch import LaunchSpec, environment_for_exec
from glm53.serve.tabby import API_TOKENS_NAME, clean_environment, tabby_main

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


def prepare_run_dir(spec: LaunchSpec, api_key: str | None) -> None:
    """The engine's private working directory (TabbyAPI): created 0700 if absent, refused if it is a link or
    another user's; its files written atomically 0600, the API key file too (and removed when there is none,
    so that a key from an earlier start cannot linger)."""
    assert spec.cwd is not None
    directory = Path(spec.cwd)
    try:
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        raise Unavailable(
            f"cannot create {directory}: {exc.strerror}", fix="set XDG_RUNTIME_DIR to a private folder"
        ) from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise Unavailable(
            f"{directory} is not a directory of this user", fix="remove it, or set XDG_RUNTIME_DIR elsewhere"
        )
    # Whoever owns the folder above can rename this one and put theirs in its place (/tmp/glm53-UID made first
    # by another user): it must be this user's or root's, and so must a link to it.
    parent = directory.parent
    if any(entry.st_uid not in (os.getuid(), 0) for entry in (parent.lstat(), parent.stat())):
        raise Unavailable(
            f"{parent} belongs to another user", fix="remove it, or set XDG_RUNTIME_DIR to a private folder"
        )
    os.chmod(directory, 0o700)
    for name, text in spec.files.items():
        atomic_write_bytes(directory / name, text.encode(), mode=0o600)
    tokens = directory / API_TOKENS_NAME
    if api_key is not None:
        # TabbyAPI's admin key may load and unload models: a random one nobody is told.
        content = json.dumps({"api_key": api_key, "admin_key": secrets.token_hex(32)}) + "\n"
        atomic_write_bytes(tokens, content.encode(), mode=0o600)
    else:
        tokens.unlink(missing_ok=True)


def exec_launch(
    spec: LaunchSpec, *, api_key: str | None = None, inherited: Mapping[str, str] | None = None
) -> NoReturn:
    """Replace this process with the engine. Only returns by raising (the command cannot be found)."""
    base = os.environ if inherited is None else inherited
    if spec.engine == "exllamav3":
        env = environment_for_exec(spec, clean_environment(base), None)
        program = spec.argv[0]
        # os.execve does not search PATH: a bare GLM53_TABBYAPI_PYTHON (python3) is looked up here.
        if os.sep not in program:
            found = shutil.which(program, path=env.get("PATH"))
            if found is None:
                raise Unavailable(f"{program} not found on PATH", fix="set GLM53_TABBYAPI_PYTHON to TabbyAPI's Python")
            program = found
        main = tabby_main(spec.argv)
        if not Path(main).is_file():
            raise Unavailable(
                f"{main} not found", fix="set GLM53_TABBYAPI_DIR to TabbyAPI's source tree (docs/serve.md)"
            )
        prepare_run_dir(spec, api_key)
        os.chdir(spec.cwd or "/")
        apply_affinity(spec.cpu_affinity)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(program, spec.argv, env)
    env = environment_for_exec(spec, base, api_key)
    program = spec.argv[0]
    if os.sep not in program and shutil.which(program, path=env.get("PATH")) is None:
        raise Unavailable(
            f"{program} not found on PATH",
            fix="install vLLM (make setup installs the CPU build) or run the recipe's image",
        )
    apply_affinity(spec.cpu_affinity)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(program, spec.argv, env)
