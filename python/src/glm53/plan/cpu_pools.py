"""CPU sets for CPU-side expert work and for the serving process, from the host topology.

In each L3 domain the first ceil(n/4) physical cores stay with serving and every other core gives one hardware
thread to the expert pool; cores are dealt round-robin across domains up to a cap. With several ranks each
rank gets ceil(cap / ranks) threads: whole L3 domains per rank (domain d -> rank d mod ranks) when there are
at least as many domains as ranks, else one flat round-robin list cut into equal parts. The serving process
may run on every allowed CPU except the SMT siblings of pool cores, so a pool thread never shares its core.
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


def plan_cpu_sets(topology: HostTopology, ranks: int, max_threads: int | None = None) -> CpuSets:
    if ranks < 1:
        raise BadInput(f"ranks must be at least 1, got {ranks}")
    if max_threads is not None and max_threads < 0:
        raise BadInput(f"--pool-threads must not be negative, got {max_threads}")
    cores = topology.physical_cores
    core_of = {cpu: core for core in cores for cpu in core}
    domains: list[list[int]] = []  # per L3 domain: the pool thread of each pool core, in core order
    for domain in topology.l3_domains:
        domain_cores = sorted({core_of[cpu] for cpu in domain if cpu in core_of}, key=lambda c: c[0])
        serve = -(-len(domain_cores) // 4)
        domains.append([core[0] for core in domain_cores[serve:]])
    per_rank = None if max_threads is None else -(-max_threads // ranks)
    pools: list[list[int]]
    if len(domains) >= ranks:
        pools = [_deal(domains[rank::ranks], per_rank) for rank in range(ranks)]
    else:
        flat = _deal(domains, None if per_rank is None else per_rank * ranks)
        size = len(flat) // ranks
        pools = [flat[rank * size : (rank + 1) * size] for rank in range(ranks)]
    siblings_of_pool = {cpu for pool in pools for thread in pool for cpu in core_of[thread] if cpu != thread}
    main = tuple(cpu for cpu in topology.allowed_cpus if cpu not in siblings_of_pool)
    return CpuSets(
        pools=tuple(tuple(sorted(pool)) for pool in pools),
        main_cpus=main,
        threads_per_rank=max(1, min((len(pool) for pool in pools), default=1)),
        l3_domains=len(topology.l3_domains),
        numa_nodes=sum(1 for cpus in topology.numa_nodes.values() if cpus),
        smt=topology.smt,
    )


__all__ = ["CpuSets", "plan_cpu_sets"]
