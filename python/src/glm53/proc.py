"""The one way glm53 runs another program, and ends it.

    run(argv, env=..., what=...)    a child in its own process group, with exactly the environment given; on a
                                    timeout, an error or a signal the whole group is killed before this returns
    environment(keep, **set)        an explicit environment: the named variables of ours, plus the ones set
    check_url(url, ...)             a URL that may follow `--`: a scheme of the allowed ones, no leading '-'
    check_commit(rev, ...)          a hex commit id (what a ref position may hold here)
    handle_termination()            for the CLI: SIGTERM and SIGHUP unwind like Ctrl-C (every `finally` runs:
                                    children killed, temp dirs removed), then exit 128 + the signal

Data never reaches a child in an option's place: callers put `--` (or git's `--end-of-options`) before
positional data and validate what cannot follow one (URLs, commits). Imports nothing above glm53.errors.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any
from urllib.parse import urlsplit

from glm53.errors import BadInput, Unavailable
from glm53.safetext import mask_secrets, printable, quoted

# Variables a child usually needs to find programs, its home, a proxy and the host's certificates.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "TZ")
NETWORK_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "SSH_AUTH_SOCK",
)
# How long a killed group's leader is waited for before this gives up on it (SIGKILL cannot be refused).
_REAP_S = 5.0


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    swallows it on its way out while every `finally` and context manager runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


class TimedOut(Exception):
    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        super().__init__(f"{argv[0]} ran longer than {timeout:g} s")
        self.timeout = timeout


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def handle_termination() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise Terminated in the main thread. Off the main thread (a
    test running the CLI on a worker) signals cannot be handled and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def environment(keep: Iterable[str] = BASE_ENV, /, **values: str) -> dict[str, str]:
    """The child's whole environment: the variables named in `keep` that are set here, then `values`."""
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(values)
    return env


def _kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's process group (its helpers too), then reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_REAP_S)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    what: str,
    timeout: float | None = None,
    input: bytes | None = None,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.PIPE,
    cwd: str | os.PathLike[str] | None = None,
    missing_fix: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` to its end and return its exit status and output (bytes; decode with `text`).

    The child starts a new session (its own process group, no controlling terminal), with `env` as its whole
    environment and no standard input unless `input` is given. When the program is missing: Unavailable
    (exit 3) naming it and `what` it was for. When `timeout` passes: the group is killed and TimedOut raised.
    When anything else ends the wait (Terminated, KeyboardInterrupt, an error): the group is killed first.
    """
    if not argv or any("\0" in arg for arg in argv):
        raise BadInput(f"{what}: a command line cannot hold a NUL character")
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except FileNotFoundError as exc:
        raise Unavailable(
            f"{what}: {printable(argv[0])} is not installed (not found on PATH)",
            fix=missing_fix or f"install {os.path.basename(argv[0])}",
        ) from exc
    except PermissionError as exc:
        raise Unavailable(f"{what}: cannot run {printable(argv[0])}: {exc.strerror}", fix=missing_fix) from exc
    finished = False
    try:
        try:
            out, err = process.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimedOut(argv, timeout or 0.0) from None
        finished = True
    finally:
        if not finished:
            _kill_group(process)
    return subprocess.CompletedProcess(list(argv), process.returncode, out, err)


def text(data: bytes | None, *, limit: int = 2000) -> str:
    """A child's output for a message: decoded, its last `limit` characters, secrets masked, escaped."""
    decoded = (data or b"").decode("utf-8", errors="replace").strip()
    return printable(mask_secrets(decoded[-limit:]))


# Transports a pinned source may come from; git's ext:: (runs a command) and fd:: are never among them.
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
_HEX = re.compile(r"^[0-9a-f]{4,64}$")


def check_url(url: str, *, what: str, schemes: Sequence[str] = GIT_SCHEMES) -> str:
    """`url` if it is a plain URL of one of `schemes`; BadInput (exit 2) naming `what` otherwise. A URL from a
    file must never be read as an option (`--upload-pack=...`) or a transport that runs commands (`ext::`)."""
    shown = quoted(url)
    if url.startswith("-"):
        raise BadInput(f"{what}: {shown} starts with '-', not a URL", fix=f"give a {'/'.join(schemes)} URL")
    if not url.isprintable() or any(char.isspace() for char in url):
        raise BadInput(f"{what}: {shown} holds white space or control characters")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in schemes or not url.lower().startswith(scheme + "://"):
        raise BadInput(
            f"{what}: {shown} is not a {', '.join(s + '://' for s in schemes)} URL",
            fix="write the URL out in full, e.g. https://github.com/OWNER/REPO",
        )
    if scheme != "file" and not urlsplit(url).hostname:
        raise BadInput(f"{what}: {shown} names no host")
    return url


def check_commit(rev: str, *, what: str) -> str:
    """`rev` if it is 4 to 64 lowercase hex digits (a commit id, short or full); BadInput otherwise."""
    if not _HEX.fullmatch(rev):
        raise BadInput(f"{what}: {quoted(rev, limit=80)} is not a commit id (4 to 64 hex digits)")
    return rev


__all__ = [
    "BASE_ENV",
    "GIT_SCHEMES",
    "NETWORK_ENV",
    "Terminated",
    "TimedOut",
    "check_commit",
    "check_url",
    "environment",
    "handle_termination",
    "run",
    "text",
]
