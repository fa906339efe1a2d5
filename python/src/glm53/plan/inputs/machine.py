"""What `glm53 plan host` plans for when it is not this machine: a rig (`--rig NAME|FILE`, glm53.host.rig; packaged:
`recipe-2x3090`, the published recipe's machine) and/or options for its parts (`--ram`, `--cpus`; the GPUs with
`--gpu-memory`).

Planning before buying the hardware, or before downloading 125 GB, needs the target's facts, not this host's:
each part described replaces what this machine would say (its RAM and cgroup limit, its CPU topology, its
GPUs); what is not described is still read here.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from glm53.constants import GIB
from glm53.errors import BadInput
from glm53.host.facts import HostFacts
from glm53.host.memory import HostMemory
from glm53.host.rig import Rig, load_rig, rig_topology
from glm53.host.topology import HostTopology, LogicalCpu
from glm53.plan.inputs.gpus import GpuSpec
from glm53.plan.inputs.sizes import parse_size

MAX_CPUS = 4096


class CpuLayout(BaseModel):
    """`--cpus`: sockets x cores x threads, numbered as Linux does (first threads of every core, then the
    second threads); `cores_per_l3` cores of a socket share one last-level cache (an AMD CCD); one NUMA node
    per socket."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sockets: int = Field(1, ge=1, le=16)
    cores_per_socket: int = Field(ge=1, le=1024)
    threads_per_core: int = Field(1, ge=1, le=8)
    cores_per_l3: int | None = Field(None, ge=1, description="default: every core of a socket")

    @model_validator(mode="after")
    def _consistent(self) -> CpuLayout:
        if self.sockets * self.cores_per_socket * self.threads_per_core > MAX_CPUS:
            raise ValueError(f"more than {MAX_CPUS} logical CPUs")
        if self.cores_per_l3 is not None and self.cores_per_socket % self.cores_per_l3:
            raise ValueError(f"{self.cores_per_l3} cores per L3 do not divide {self.cores_per_socket} cores")
        return self

    @property
    def text(self) -> str:
        l3 = self.cores_per_l3 or self.cores_per_socket
        return f"{self.sockets} x {self.cores_per_socket} cores x {self.threads_per_core} threads, {l3} cores per L3"

    def topology(self) -> HostTopology:
        cores = self.sockets * self.cores_per_socket
        l3 = self.cores_per_l3 or self.cores_per_socket
        logical: list[LogicalCpu] = []
        domains: dict[int, tuple[int, ...]] = {}
        for cpu in range(cores * self.threads_per_core):
            core = cpu % cores
            socket = core // self.cores_per_socket
            group = core // l3
            domain = tuple(
                sorted(c + t * cores for c in range(group * l3, (group + 1) * l3) for t in range(self.threads_per_core))
            )
            domains[group] = domain
            siblings = tuple(core + t * cores for t in range(self.threads_per_core))
            logical.append(
                LogicalCpu(cpu=cpu, package=socket, core_id=core, siblings=siblings, l3_domain=domain, numa_node=socket)
            )
        packages = tuple(tuple(c.cpu for c in logical if c.package == socket) for socket in range(self.sockets))
        return HostTopology(
            allowed_cpus=tuple(range(len(logical))),
            cpus=tuple(logical),
            packages=packages,
            l3_domains=tuple(sorted(domains.values(), key=lambda d: d[0])),
            numa_nodes={socket: packages[socket] for socket in range(self.sockets)},
        )


_CPUS = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\d+)\s*c(?:\s*x\s*(\d+)\s*t)?(?:\s*/\s*(\d+))?\s*$", re.IGNORECASE)


def parse_cpus(text: str) -> CpuLayout:
    """`--cpus`: CORESc, optionally a SOCKETSx prefix, an xTHREADSt suffix and /CORES_PER_L3: 32cx2t/8 (the
    recipe's Threadripper), 16c, 2x64cx2t."""
    match = _CPUS.match(text)
    if match is None:
        raise BadInput(
            f"--cpus {text[:40]!r} is not CORESc with an optional SOCKETSx prefix, xTHREADSt suffix and /CORES_PER_L3",
            fix="e.g. --cpus 32cx2t/8 (32 cores, 2 threads each, 8 cores per L3), --cpus 16c or --cpus 2x64cx2t",
        )
    sockets, cores, threads, l3 = match.groups()
    try:
        return CpuLayout(
            sockets=int(sockets or 1),
            cores_per_socket=int(cores),
            threads_per_core=int(threads or 1),
            cores_per_l3=int(l3) if l3 else None,
        )
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise BadInput(f"--cpus {text!r}: {problem['msg']}", fix="e.g. --cpus 32cx2t/8") from exc


class Machine(BaseModel):
    """What the plan is for, where it differs from this machine."""

    model_config = ConfigDict(frozen=True)

    rig: Rig | None = None
    ram_bytes: int | None = None
    cpus: CpuLayout | None = None

    @property
    def described(self) -> bool:
        return self.rig is not None or self.ram_bytes is not None or self.cpus is not None

    def gpus(self) -> list[GpuSpec] | None:
        if self.rig is None:
            return None
        specs = []
        for i, gpu in enumerate(self.rig.gpus):
            spec = GpuSpec(index=i, name=gpu.name, total_bytes=gpu.memory_bytes, numa_node=gpu.numa_node)
            if gpu.memory_bandwidth is not None:
                spec = spec.model_copy(update={"memory_bandwidth": gpu.memory_bandwidth})
            specs.append(spec)
        return specs

    def ram(self) -> int | None:
        if self.ram_bytes is not None:
            return self.ram_bytes
        return self.rig.ram_bytes if self.rig is not None else None

    def topology(self) -> HostTopology | None:
        if self.cpus is not None:
            return self.cpus.topology()
        return rig_topology(self.rig) if self.rig is not None else None

    def apply(self, host: HostFacts) -> HostFacts:
        """This machine's facts with the described parts replaced (no cgroup limit: the target's own RAM)."""
        update: dict[str, object] = {}
        ram = self.ram()
        if ram is not None:
            update["memory"] = HostMemory(
                mem_total_bytes=ram,
                mem_available_bytes=None,
                cgroup_version=None,
                cgroup_limit_bytes=None,
                effective_limit_bytes=ram,
            )
            update["memory_error"] = None
        topology = self.topology()
        if topology is not None:
            update["topology"] = topology
            update["topology_error"] = None
        return host.model_copy(update=update)

    def describe(self) -> str:
        """One line: what the plan is for."""
        parts: list[str] = []
        if self.rig is not None:
            gpus = ", ".join(f"{g.name} {g.memory_bytes / GIB:g} GiB" for g in self.rig.gpus)
            parts.append(f"rig {self.rig.name}: {gpus}")
        ram = self.ram()
        if ram is not None:
            parts.append(f"{ram / GIB:,.2f} GiB RAM")
        if self.cpus is not None:
            parts.append(f"CPUs {self.cpus.text}")
        elif self.rig is not None:
            parts.append(f"CPUs {self.rig.cores} cores x {self.rig.threads_per_core} threads")
        return "; ".join(parts)


def target_from_options(rig: str | None, ram: str | None, cpus: str | None) -> Machine:
    return Machine(
        rig=load_rig(rig) if rig is not None else None,
        ram_bytes=parse_size(ram, flag="--ram", positive=True) if ram is not None else None,
        cpus=parse_cpus(cpus) if cpus is not None else None,
    )


__all__ = ["CpuLayout", "Machine", "parse_cpus", "target_from_options"]
