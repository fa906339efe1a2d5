"""CPU sets for CPU-side expert work and for the serving process, from the host topology.

In each L3 domain the first ceil(n/4) physical cores stay with serving and every other core gives one hardware
thread to the expert pool; cores are dealt round-robin across domains up to a cap. With several ranks each
rank gets ceil(cap / ranks) threads: whole L3 domains per rank (domain d -> rank d mod ranks) when there are
at least as many domains as ranks, else one flat round-robin list cut into equal parts. The serving process
may run on every allowed CPU except the SMT siblings of pool cores, so a pool thread never shares its core.

NUMA: with GPU nodes given (the PCI device's `numa_node` of each rank's GPU) on a host whose allowed CPUs span
several NUMA nodes, each rank's pool is drawn from its own GPU's node only (ranks sharing a node split that
node's domains by the rule above): the pool's threads, and the pinned host memory they first touch, sit on
the node whose PCIe root the GPU's copies cross. Where that cannot be done (one node, a GPU's node unknown,
or no pool core on a GPU's node) the pools are planned as above and `placement` says why.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput
from glm53.host.topology import HostTopology, format_cpu_list


class CpuSets(BaseModel):
    model_config = ConfigDict(frozen=True)

    pools: tuple[tuple[int, ...], ...]  # one per rank
    main_cpus: tuple[int, ...]
    threads_per_rank: int
    l3_domains: int
    numa_nodes: int
    smt: bool
    rank_nodes: tuple[int | None, ...] = ()  # NUMA node of each rank's pool; () when not NUMA-placed
    placement: str = ""  # how the pools were placed, in words

    @property
    def pools_text(self) -> str:
        """One CPU list per rank, ';' between ranks; empty when no core is left for a pool (pool off)."""
        if not any(self.pools):
            return ""
        return ";".join(format_cpu_list(pool) for pool in self.pools)

    @property
    def main_text(self) -> str:
        return format_cpu_list(self.main_cpus)


def _deal(domains: list[list[int]], limit: int | None) -> list[int]:
    """Round-robin over domains: the first pool core of each, then the second of each, ... up to `limit`."""
    out: list[int] = []
    depth = 0
    while any(depth < len(d) for d in domains):
        for domain in domains:
            if limit is not None and len(out) >= limit:
                return out
            if depth < len(domain):
                out.append(domain[depth])
        depth += 1
    return out


def _pool_domains(topology: HostTopology, cpus: set[int] | None = None) -> list[list[int]]:
    """Per L3 domain (restricted to `cpus`): the pool thread of each pool core, in core order."""
    core_of = {cpu: core for core in topology.physical_cores for cpu in core}
    domains: list[list[int]] = []
    for domain in topology.l3_domains:
        members = [cpu for cpu in domain if cpus is None or cpu in cpus]
        domain_cores = sorted({core_of[cpu] for cpu in members if cpu in core_of}, key=lambda c: c[0])
        if not domain_cores:
            continue
        serve = -(-len(domain_cores) // 4)
        domains.append([core[0] for core in domain_cores[serve:]])
    return domains


def _split(domains: list[list[int]], ranks: int, per_rank: int | None) -> list[list[int]]:
    if len(domains) >= ranks:
        return [_deal(domains[rank::ranks], per_rank) for rank in range(ranks)]
    flat = _deal(domains, None if per_rank is None else per_rank * ranks)
    size = len(flat) // ranks
    return [flat[rank * size : (rank + 1) * size] for rank in range(ranks)]


def _numa_reason(topology: HostTopology, ranks: int, gpu_nodes: list[int | None] | None) -> str | None:
    """Why the pools cannot follow the GPUs' NUMA nodes; None when they can."""
    nodes = {node for node, cpus in topology.numa_nodes.items() if cpus}
    if len(nodes) < 2:
        return "one NUMA node with allowed CPUs: every pool is local to every GPU"
    if gpu_nodes is None or len(gpu_nodes) < ranks:
        return "the GPUs' NUMA nodes are unknown (GPUs given by size, or NVML gave no PCI bus id)"
    used = gpu_nodes[:ranks]
    unknown = [rank for rank, node in enumerate(used) if node is None]
    if unknown:
        return (
            f"the NUMA node of rank {unknown[0]}'s GPU is unknown (sysfs numa_node -1: the firmware gives the "
            "PCI root no proximity domain)"
        )
    missing = sorted({node for node in used if node is not None and node not in nodes})
    if missing:
        return f"no allowed CPU on NUMA node {missing[0]}, where a GPU sits (cpuset or cgroup)"
    return None


def plan_cpu_sets(
    topology: HostTopology, ranks: int, max_threads: int | None = None, gpu_nodes: list[int | None] | None = None
) -> CpuSets:
    if ranks < 1:
        raise BadInput(f"ranks must be at least 1, got {ranks}")
    if max_threads is not None and max_threads < 0:
        raise BadInput(f"--pool-threads must not be negative, got {max_threads}")
    core_of = {cpu: core for core in topology.physical_cores for cpu in core}
    per_rank = None if max_threads is None else -(-max_threads // ranks)
    reason = _numa_reason(topology, ranks, gpu_nodes)
    pools: list[list[int]]
    rank_nodes: tuple[int | None, ...] = ()
    if reason is None and gpu_nodes is not None:
        used = [node for node in gpu_nodes[:ranks] if node is not None]
        pools = [[] for _ in range(ranks)]
        for node in sorted(set(used)):
            members = [rank for rank, rank_node in enumerate(used) if rank_node == node]
            domains = _pool_domains(topology, set(topology.numa_nodes[node]))
            for rank, pool in zip(members, _split(domains, len(members), per_rank), strict=True):
                pools[rank] = pool
        rank_nodes = tuple(used)
        placement = "; ".join(
            f"rank {rank}: GPU on NUMA node {node}, pool on node {node}" for rank, node in enumerate(used)
        )
        if len(set(used)) == 1 and len(used) > 1:
            placement += f" (all GPUs on node {used[0]}: their pools share its cores; the other nodes serve)"
    else:
        pools = _split(_pool_domains(topology), ranks, per_rank)
        placement = f"not NUMA-placed: {reason}"
    siblings_of_pool = {cpu for pool in pools for thread in pool for cpu in core_of[thread] if cpu != thread}
    main = tuple(cpu for cpu in topology.allowed_cpus if cpu not in siblings_of_pool)
    return CpuSets(
        pools=tuple(tuple(sorted(pool)) for pool in pools),
        main_cpus=main,
        threads_per_rank=max(1, min((len(pool) for pool in pools), default=1)),
        l3_domains=len(topology.l3_domains),
        numa_nodes=sum(1 for cpus in topology.numa_nodes.values() if cpus),
        smt=topology.smt,
        rank_nodes=rank_nodes,
        placement=placement,
    )


__all__ = ["CpuSets", "plan_cpu_sets"]
