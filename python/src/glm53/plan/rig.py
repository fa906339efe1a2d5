"""A rig to plan for that is not this machine: its GPUs, RAM and CPU layout, from a rig file (`--rig NAME|FILE`;
packaged: `recipe-2x3090`, the published recipe's machine) or options (`--ram`, `--cpus`, `--gpu-memory`).

Planning before buying the hardware, or before downloading 125 GB, needs the target's facts, not this host's:
each part described replaces what this machine would say (its RAM and cgroup limit, its CPU topology, its
GPUs); what is not described is still read here.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import read_json
from glm53.host.facts import HostFacts
from glm53.host.memory import HostMemory
from glm53.host.topology import HostTopology, LogicalCpu
from glm53.plan.planner import GpuSpec
from glm53.plan.sizes import parse_size

RIG_SCHEMA: Literal["glm53.rig/1"] = "glm53.rig/1"
RIGS_RESOURCE = "data/rigs"
MAX_CPUS = 4096
MAX_GPUS = 64


class RigGpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("GPU", min_length=1, max_length=200)
    memory: str = Field(description="e.g. 24GiB")
    memory_bandwidth_gb_s: float | None = Field(None, gt=0, le=100_000, description="GB/s; default: RTX 3090's")

    @property
    def total_bytes(self) -> int:
        return parse_size(self.memory, flag="memory", positive=True)


class CpuLayout(BaseModel):
    """Sockets x cores x threads, numbered as Linux does (first threads of every core, then the second
    threads); `cores_per_l3` cores of a socket share one last-level cache (an AMD CCD/CCX); one NUMA node per
    socket."""

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
            raise ValueError(
                f"cores_per_l3 {self.cores_per_l3} does not divide cores_per_socket {self.cores_per_socket}"
            )
        return self

    @property
    def text(self) -> str:
        l3 = self.cores_per_l3 or self.cores_per_socket
        return f"{self.sockets} x {self.cores_per_socket} cores x {self.threads_per_core} threads, {l3} cores per L3"

    def topology(self) -> HostTopology:
        cores = self.sockets * self.cores_per_socket
        l3 = self.cores_per_l3 or self.cores_per_socket
        logical: list[LogicalCpu] = []
        domains: dict[int, list[int]] = {}
        for cpu in range(cores * self.threads_per_core):
            core = cpu % cores
            socket = core // self.cores_per_socket
            siblings = tuple(core + t * cores for t in range(self.threads_per_core))
            group = core // l3
            domain_cores = range(group * l3, (group + 1) * l3)
            domain = tuple(sorted(c + t * cores for c in domain_cores for t in range(self.threads_per_core)))
            domains[group] = list(domain)
            logical.append(
                LogicalCpu(cpu=cpu, package=socket, core_id=core, siblings=siblings, l3_domain=domain, numa_node=socket)
            )
        packages = tuple(tuple(c.cpu for c in logical if c.package == socket) for socket in range(self.sockets))
        return HostTopology(
            allowed_cpus=tuple(range(len(logical))),
            cpus=tuple(logical),
            packages=packages,
            l3_domains=tuple(tuple(d) for d in sorted(domains.values(), key=lambda d: d[0])),
            numa_nodes={socket: packages[socket] for socket in range(self.sockets)},
        )


class Rig(BaseModel):
    """A rig file (`glm53.rig/1`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal["glm53.rig/1"]
    name: str = Field(min_length=1, max_length=100)
    about: str = ""
    gpus: tuple[RigGpu, ...] = Field(min_length=1, max_length=MAX_GPUS)
    ram: str = Field(description="MemTotal, e.g. 128GiB")
    cpu: CpuLayout

    @model_validator(mode="after")
    def _sizes(self) -> Rig:
        for gpu in self.gpus:
            _size_or_error(gpu.memory, "gpus[].memory")
        _size_or_error(self.ram, "ram")
        return self


def _size_or_error(text: str, field: str) -> int:
    try:
        return parse_size(text, flag=field, positive=True)
    except BadInput as exc:
        raise ValueError(exc.message) from exc


def packaged_rigs() -> list[str]:
    folder = resources.files("glm53").joinpath(RIGS_RESOURCE)
    return sorted(entry.name.removesuffix(".json") for entry in folder.iterdir() if entry.name.endswith(".json"))


def parse_rig(raw: object, *, source: str) -> Rig:
    if isinstance(raw, dict) and raw.get("schema_version") != RIG_SCHEMA:
        raise BadInput(
            f"{source}: schema_version {raw.get('schema_version')!r} is not {RIG_SCHEMA!r}",
            hint='a rig file starts with "schema_version": "glm53.rig/1" (see docs/plan.md)',
        )
    try:
        return Rig.model_validate(raw)
    except ValidationError as exc:
        raise invalid_document(exc, source, hint="fix the rig file (docs/plan.md shows one)") from exc


@functools.cache
def _packaged(name: str) -> Rig:
    text = resources.files("glm53").joinpath(f"{RIGS_RESOURCE}/{name}.json").read_text(encoding="utf-8")
    return parse_rig(json.loads(text), source=f"glm53/{RIGS_RESOURCE}/{name}.json")


def load_rig(spec: str) -> Rig:
    """`--rig`: a packaged rig's name, or a rig file's path."""
    if spec in packaged_rigs():
        return _packaged(spec)
    path = Path(spec)
    if path.suffix == ".json" or "/" in spec or path.exists():
        return parse_rig(read_json(path, what="rig file"), source=str(path))
    raise BadInput(
        f"--rig {spec!r} is neither a packaged rig nor a file",
        hint=f"packaged: {', '.join(packaged_rigs())}; or give a rig file's path (docs/plan.md)",
    )


_CPUS = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\d+)\s*c(?:\s*x\s*(\d+)\s*t)?(?:\s*/\s*(\d+))?\s*$", re.IGNORECASE)


def parse_cpus(text: str) -> CpuLayout:
    """`--cpus`: CORESc, optionally a SOCKETSx prefix, an xTHREADSt suffix and /CORES_PER_L3: 32cx2t/8 (the
    recipe's Threadripper), 16c, 2x64cx2t."""
    match = _CPUS.match(text)
    if match is None:
        raise BadInput(
            f"--cpus {text[:40]!r} is not CORESc with an optional SOCKETSx prefix, xTHREADSt suffix and /CORES_PER_L3",
            hint="e.g. --cpus 32cx2t/8 (32 cores, 2 threads each, 8 cores per L3), --cpus 16c or --cpus 2x64cx2t",
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
        raise BadInput(f"--cpus {text!r}: {problem['msg']}", hint="e.g. --cpus 32cx2t/8") from exc


class Target(BaseModel):
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
        return [
            GpuSpec(index=i, name=gpu.name, total_bytes=gpu.total_bytes)
            if gpu.memory_bandwidth_gb_s is None
            else GpuSpec(
                index=i, name=gpu.name, total_bytes=gpu.total_bytes, memory_bandwidth=gpu.memory_bandwidth_gb_s * 1e9
            )
            for i, gpu in enumerate(self.rig.gpus)
        ]

    def layout(self) -> CpuLayout | None:
        return self.cpus or (self.rig.cpu if self.rig is not None else None)

    def ram(self) -> int | None:
        if self.ram_bytes is not None:
            return self.ram_bytes
        return parse_size(self.rig.ram, flag="ram", positive=True) if self.rig is not None else None

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
        layout = self.layout()
        if layout is not None:
            update["topology"] = layout.topology()
            update["topology_error"] = None
        return host.model_copy(update=update)

    def describe(self) -> str:
        """One line: what the plan is for."""
        parts: list[str] = []
        if self.rig is not None:
            parts.append(f"rig {self.rig.name}: " + ", ".join(f"{g.name} {g.memory}" for g in self.rig.gpus))
        ram = self.ram()
        if ram is not None:
            parts.append(f"{ram / (1 << 30):,.2f} GiB RAM")
        layout = self.layout()
        if layout is not None:
            parts.append(f"CPUs {layout.text}")
        return "; ".join(parts)


def target_from_options(rig: str | None, ram: str | None, cpus: str | None) -> Target:
    return Target(
        rig=load_rig(rig) if rig is not None else None,
        ram_bytes=parse_size(ram, flag="--ram", positive=True) if ram is not None else None,
        cpus=parse_cpus(cpus) if cpus is not None else None,
    )


__all__ = [
    "CpuLayout",
    "Rig",
    "RigGpu",
    "Target",
    "load_rig",
    "packaged_rigs",
    "parse_cpus",
    "parse_rig",
    "target_from_options",
]
