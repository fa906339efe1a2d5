"""Layers are independent: spread per-layer work over processes (fork), or run it in line for small jobs."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")

# Below this many layer-steps the processes cost more than they save.
SMALL_WORK = 200_000


def default_workers(work: int) -> int:
    """Processes for `work` layer-steps: the CPUs this process may use, or 1 for small jobs."""
    if work < SMALL_WORK or not hasattr(os, "sched_getaffinity") or not hasattr(os, "fork"):
        return 1
    return max(1, len(os.sched_getaffinity(0)))


def cpu_seconds() -> float:
    """CPU time of this process and of its finished workers (a shut-down pool's processes count)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def layer_map(
    function: Callable[[_T], _R],
    tasks: list[_T],
    workers: int,
    on_result: Callable[[int], None] | None = None,
) -> list[_R]:
    """`function` over `tasks`, in order, on `workers` processes; `on_result(done)` after each result."""
    results: list[_R] = []
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            results.append(function(task))
            if on_result is not None:
                on_result(len(results))
        return results
    context = multiprocessing.get_context("fork")
    # multiprocessing.Pool, not concurrent.futures: its terminate() ends the workers and its own threads
    # synchronously and is public, where the executor leaves a manager thread that Python's exit hook then waits
    # on (a command hung after SIGTERM on Debian's 3.11.2).
    pool = context.Pool(processes=min(workers, len(tasks)), initializer=_worker_signals)
    try:
        for result in pool.imap(function, tasks):
            results.append(result)
            if on_result is not None:
                on_result(len(results))
    except BaseException:
        # An error, Ctrl-C or SIGTERM (glm53.proc.Terminated): end the workers here rather than leave them
        # blocked on a queue nobody reads.
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
    return results


def _worker_signals() -> None:
    """A worker dies of SIGTERM (as `layer_map` ends it) and leaves Ctrl-C to the command, which ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


__all__ = ["SMALL_WORK", "cpu_seconds", "default_workers", "layer_map"]
