"""CPU topology from sysfs: allowed CPUs, packages, SMT siblings, L3 domains and NUMA nodes.

Read the way the kernel lays it out (`/sys/devices/system/cpu/cpuN/topology/*`,
`/sys/devices/system/cpu/cpuN/cache/indexK/{level,shared_cpu_list}`, `/sys/devices/system/node/nodeN/cpulist`,
`/proc/self/status` `Cpus_allowed_list`), all under `root` so tests use fixture trees.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_INDEX_DIR = re.compile(r"^index(\d+)$")
# Linux's largest configurable CPU count (NR_CPUS on x86-64): a bigger id is a typo, not a machine.
MAX_CPUS = 8192
_CPU_HINT = "use this host's CPU ids (lscpu -e)"


def parse_cpu_list(text: str, *, what: str = "CPU list") -> tuple[int, ...]:
    """Parse the kernel's list format ("0-3,8,10-11") into sorted CPU ids."""
    cpus: set[int] = set()
    body = text.strip()
    if not body:
        return ()
    for part in body.split(","):
        item = part.strip()
        if not item:
            continue
        low, dash, high = item.partition("-")
        if not re.fullmatch(r"[0-9]+", low) or (dash and not re.fullmatch(r"[0-9]+", high)):
            raise BadInput(f"{what}: {item[:40]!r} is not a CPU number or range", fix="use the form 0-3,8,10-11")
        if max(len(low), len(high)) > len(str(MAX_CPUS)):
            raise BadInput(f"{what}: {item[:40]!r} is beyond the {MAX_CPUS} CPUs Linux supports", fix=_CPU_HINT)
        start, end = int(low), int(high) if dash else int(low)
        if end < start:
            raise BadInput(f"{what}: range {item!r} runs backwards", fix="write ranges low-high")
        if end >= MAX_CPUS:
            raise BadInput(f"{what}: CPU {end} is beyond the {MAX_CPUS} CPUs Linux supports", fix=_CPU_HINT)
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's list format, ranges collapsed: [0,1,2,3,8] -> "0-3,8"."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)


class LogicalCpu(BaseModel):
    model_config = ConfigDict(frozen=True)

    cpu: int
    package: int
    core_id: int
    # All hardware threads of this physical core, this one included.
    siblings: tuple[int, ...]
    # CPUs sharing this CPU's L3 (last-level) cache; None when sysfs has no level-3 cache entry.
    l3_domain: tuple[int, ...] | None
    numa_node: int | None


class HostTopology(BaseModel):
    model_config = ConfigDict(frozen=True)

    allowed_cpus: tuple[int, ...]
    cpus: tuple[LogicalCpu, ...]  # the allowed CPUs only, ordered by id
    packages: tuple[tuple[int, ...], ...]
    l3_domains: tuple[tuple[int, ...], ...]  # restricted to allowed CPUs, ordered by first CPU
    numa_nodes: dict[int, tuple[int, ...]]

    @property
    def smt(self) -> bool:
        return any(len(cpu.siblings) > 1 for cpu in self.cpus)

    @property
    def physical_cores(self) -> tuple[tuple[int, ...], ...]:
        """Each physical core as its allowed threads, ordered by first thread."""
        allowed = set(self.allowed_cpus)
        cores = {tuple(c for c in cpu.siblings if c in allowed) for cpu in self.cpus}
        return tuple(sorted((core for core in cores if core), key=lambda core: core[0]))

    def cpu(self, cpu_id: int) -> LogicalCpu:
        for cpu in self.cpus:
            if cpu.cpu == cpu_id:
                return cpu
        raise KeyError(cpu_id)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_allowed_cpus(root: Path = Path("/")) -> tuple[int, ...]:
    """CPUs this process may run on: `Cpus_allowed_list` in /proc/self/status (as sched_getaffinity)."""
    status = _read(root / "proc/self/status")
    if status is not None:
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key == "Cpus_allowed_list":
                return parse_cpu_list(value, what=f"{root / 'proc/self/status'} Cpus_allowed_list")
    online = _read(root / "sys/devices/system/cpu/online")
    if online is None:
        raise BadInput(
            f"cannot find the allowed CPUs under {root}",
            fix="neither /proc/self/status nor /sys/devices/system/cpu/online is readable",
        )
    return parse_cpu_list(online, what=str(root / "sys/devices/system/cpu/online"))


def _l3_shared_list(cpu_dir: Path) -> tuple[int, ...] | None:
    cache = cpu_dir / "cache"
    if not cache.is_dir():
        return None
    for index_dir in sorted(cache.iterdir()):
        if not _INDEX_DIR.match(index_dir.name):
            continue
        if _read(index_dir / "level") == "3":
            shared = _read(index_dir / "shared_cpu_list")
            if shared is not None:
                return parse_cpu_list(shared, what=str(index_dir / "shared_cpu_list"))
    return None


def _numa_nodes(root: Path) -> dict[int, tuple[int, ...]]:
    node_root = root / "sys/devices/system/node"
    nodes: dict[int, tuple[int, ...]] = {}
    if not node_root.is_dir():
        return nodes
    for entry in node_root.iterdir():
        match = _NODE_DIR.match(entry.name)
        if match is None:
            continue
        cpulist = _read(entry / "cpulist")
        if cpulist is not None:
            nodes[int(match.group(1))] = parse_cpu_list(cpulist, what=str(entry / "cpulist"))
    return dict(sorted(nodes.items()))


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def sysfs_bus_id(bus_id: str) -> str | None:
    """NVML's PCI bus id ("00000000:41:00.0", 8-digit domain) in sysfs's form ("0000:41:00.0"); None if it is
    not a bus id."""
    match = _BUS_ID.match(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def pci_device_numa_node(root: Path, bus_id: str) -> int | None:
    """The NUMA node of a PCI device from `/sys/bus/pci/devices/<id>/numa_node`; None when the id is not a bus
    id, the file is missing, or the kernel says -1 (no affinity known: firmware gave no proximity domain)."""
    name = sysfs_bus_id(bus_id)
    if name is None:
        return None
    text = _read(root / "sys/bus/pci/devices" / name / "numa_node")
    if text is None or not text.lstrip("-").isdigit():
        return None
    node = int(text)
    return node if node >= 0 else None


def read_topology(root: Path = Path("/")) -> HostTopology:
    cpu_root = root / "sys/devices/system/cpu"
    if not cpu_root.is_dir():
        raise BadInput(f"{cpu_root} does not exist", fix="is /sys mounted?")
    allowed = read_allowed_cpus(root)
    allowed_set = set(allowed)
    nodes = _numa_nodes(root)
    node_of = {cpu: node for node, cpus in nodes.items() for cpu in cpus}
    cpus: list[LogicalCpu] = []
    for cpu_id in allowed:
        cpu_dir = cpu_root / f"cpu{cpu_id}"
        topo = cpu_dir / "topology"
        package = _read(topo / "physical_package_id")
        core = _read(topo / "core_id")
        siblings = _read(topo / "thread_siblings_list")
        if package is None or siblings is None:
            raise BadInput(
                f"{topo} is missing physical_package_id or thread_siblings_list",
                fix="the kernel exposes CPU topology in sysfs since 2.6; is /sys mounted?",
            )
        cpus.append(
            LogicalCpu(
                cpu=cpu_id,
                package=int(package),
                core_id=int(core) if core is not None and core.lstrip("-").isdigit() else cpu_id,
                siblings=parse_cpu_list(siblings, what=str(topo / "thread_siblings_list")),
                l3_domain=_l3_shared_list(cpu_dir),
                numa_node=node_of.get(cpu_id),
            )
        )
    packages: dict[int, list[int]] = {}
    for cpu in cpus:
        packages.setdefault(cpu.package, []).append(cpu.cpu)
    domains: set[tuple[int, ...]] = set()
    for cpu in cpus:
        # No L3 in sysfs (some VMs): treat each package as one domain.
        shared = cpu.l3_domain if cpu.l3_domain is not None else tuple(packages[cpu.package])
        domains.add(tuple(c for c in shared if c in allowed_set))
    return HostTopology(
        allowed_cpus=allowed,
        cpus=tuple(cpus),
        packages=tuple(tuple(v) for _, v in sorted(packages.items())),
        l3_domains=tuple(sorted((d for d in domains if d), key=lambda d: d[0])),
        numa_nodes={node: tuple(c for c in members if c in allowed_set) for node, members in nodes.items()},
    )


__all__ = [
    "HostTopology",
    "LogicalCpu",
    "format_cpu_list",
    "parse_cpu_list",
    "pci_device_numa_node",
    "read_allowed_cpus",
    "read_topology",
    "sysfs_bus_id",
]
