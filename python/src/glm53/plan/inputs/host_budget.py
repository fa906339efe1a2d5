"""The host's memory budget for a plan, and the error of a request no host budget can hold."""

from __future__ import annotations

from glm53.constants import GIB, format_gib
from glm53.errors import CheckFailed
from glm53.host.memory import HostMemory


class Infeasible(CheckFailed):
    """The request cannot be planned on this host; names the binding constraint and the smallest fix."""

    def __init__(self, message: str, *, constraint: str, fix: str) -> None:
        super().__init__(f"infeasible: {message}", fix=fix)
        self.constraint = constraint


def host_budget(memory: HostMemory, reserve: int) -> tuple[int, str]:
    """The cgroup limit when it is below MemTotal, else MemTotal rounded up to 8 GiB minus the reserve."""
    total = memory.mem_total_bytes
    if memory.cgroup_limit_bytes is not None and memory.cgroup_limit_bytes < total:
        return (
            memory.cgroup_limit_bytes,
            f"cgroup v{memory.cgroup_version} limit ({memory.cgroup_limit_source})",
        )
    rounded = -(-total // (8 * GIB)) * 8 * GIB
    budget = min(total, rounded - reserve)
    return (
        budget,
        f"MemTotal {total / GIB:.1f} GiB rounded up to {rounded // GIB} GiB minus {reserve / GIB:g} GiB",
    )


def host_memory_fix(memory: HostMemory, needed: int, reserve: int) -> str:
    """The smallest change: a higher cgroup limit when RAM would do, else the installed RAM needed."""
    # Installed RAM is a multiple of 8 GiB; the budget is that minus the reserve.
    ram = -(-(needed + reserve) // (8 * GIB)) * 8 * GIB
    without_cgroup, _ = host_budget(memory.model_copy(update={"cgroup_limit_bytes": None}), reserve)
    limited = memory.cgroup_limit_bytes is not None and memory.cgroup_limit_bytes < memory.mem_total_bytes
    if limited and without_cgroup >= needed:
        return f"raise the cgroup memory limit to at least {format_gib(needed)} (systemd MemoryMax=, docker --memory)"
    if limited:
        return f"needs {format_gib(needed)} of budget: {ram // GIB} GiB of RAM and a cgroup limit of at least that"
    return (
        f"needs {format_gib(needed)} of budget: {ram // GIB} GiB of RAM ({format_gib(reserve)} stays with the system)"
    )
