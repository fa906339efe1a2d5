"""A rig the user describes instead of this machine: its GPUs, RAM and CPU layout, to plan before buying or
downloading. Packaged examples live in data/rigs (`recipe-2x3090`: the recipe's 2x RTX 3090 + 128 GB on a
Threadripper PRO 5975WX); any JSON file of the same shape works.

    load_rig(name_or_path) -> Rig
    rig_topology(rig) -> HostTopology       cores and SMT siblings numbered as Linux numbers them
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from glm53.errors import BadInput, invalid_document
from glm53.fsutil import parse_json, read_json
from glm53.host.topology import HostTopology, LogicalCpu

RIGS_RESOURCE = "data/rigs"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RigGpu(_Strict):
    name: str = Field(min_length=1, max_length=200)
    memory_bytes: int = Field(gt=0, le=1 << 50)
    # GB/s of the card's memory (the datasheet's figure); None: the planner's assumption.
    memory_bandwidth: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    compute_capability: tuple[int, int] | None = None
    numa_node: int | None = Field(default=None, ge=0)


class Rig(_Strict):
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    gpus: list[RigGpu] = Field(min_length=1, max_length=64)
    ram_bytes: int = Field(gt=0, le=1 << 50)
    cores: int = Field(gt=0, le=4096)  # physical cores
    threads_per_core: int = Field(default=1, ge=1, le=8)
    numa_nodes: int = Field(default=1, ge=1, le=64)
    # Cores that share one L3 cache (an AMD CCD); None: every core of a NUMA node shares one.
    cores_per_l3: int | None = Field(default=None, ge=1, le=4096)
    # Effective host memory bandwidth in bytes/s (what a STREAM-like copy reaches); None: the assumption.
    memory_bandwidth: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    source: str = ""


def rig_names() -> tuple[str, ...]:
    folder = resources.files("glm53").joinpath(RIGS_RESOURCE)
    return tuple(sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")))


def load_rig(spec: str, *, flag: str = "--rig") -> Rig:
    """A packaged rig by name, or a JSON file by path."""
    if spec in rig_names():
        data = parse_json(
            resources.files("glm53").joinpath(RIGS_RESOURCE, f"{spec}.json").read_bytes(), what=f"rig {spec}"
        )
        what = f"packaged rig {spec}"
    elif spec.endswith(".json") or "/" in spec:
        data = read_json(Path(spec), what=f"{flag} {spec}")
        what = f"{flag} {spec}"
    else:
        raise BadInput(
            f"{flag}: no rig named {spec!r}",
            fix=f"packaged rigs: {', '.join(rig_names())}; or give a JSON file (docs/plan.md shows its fields)",
        )
    try:
        return Rig.model_validate(data)
    except ValidationError as exc:
        raise invalid_document(exc, what, fix="docs/plan.md lists a rig's fields") from exc


def rig_topology(rig: Rig) -> HostTopology:
    """Logical CPUs as Linux numbers them on such a machine: cores 0..C-1 first, their SMT siblings C..2C-1;
    cores dealt to NUMA nodes in equal contiguous blocks, one L3 domain per node (or per `cores_per_l3` cores
    of a node)."""
    per_node = -(-rig.cores // rig.numa_nodes)
    cpus: list[LogicalCpu] = []
    for thread in range(rig.threads_per_core):
        for core in range(rig.cores):
            siblings = tuple(core + t * rig.cores for t in range(rig.threads_per_core))
            node = core // per_node
            span = min(rig.cores_per_l3 or per_node, per_node)
            first = node * per_node + (core - node * per_node) // span * span
            domain = tuple(
                c + t * rig.cores
                for t in range(rig.threads_per_core)
                for c in range(first, min(rig.cores, first + span, (node + 1) * per_node))
            )
            cpus.append(
                LogicalCpu(
                    cpu=core + thread * rig.cores,
                    package=0,
                    core_id=core,
                    siblings=siblings,
                    l3_domain=tuple(sorted(domain)),
                    numa_node=node,
                )
            )
    cpus.sort(key=lambda c: c.cpu)
    nodes: dict[int, list[int]] = {}
    for cpu in cpus:
        nodes.setdefault(cpu.numa_node or 0, []).append(cpu.cpu)
    domains = sorted({cpu.l3_domain for cpu in cpus if cpu.l3_domain}, key=lambda d: d[0])
    return HostTopology(
        allowed_cpus=tuple(c.cpu for c in cpus),
        cpus=tuple(cpus),
        packages=(tuple(c.cpu for c in cpus),),
        l3_domains=tuple(domains),
        numa_nodes={node: tuple(members) for node, members in nodes.items()},
    )


__all__ = ["Rig", "RigGpu", "load_rig", "rig_names", "rig_topology"]
