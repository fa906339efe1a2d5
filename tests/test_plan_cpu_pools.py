"""CPU pools and the serving set on fixture topologies."""

from __future__ import annotations

from pathlib import Path

from glm53.host.topology import read_topology
from glm53.plan.inputs.cpu_sets import plan_cpu_sets

HOSTS = Path(__file__).parent / "fixtures" / "hosts"


def test_threadripper_5975wx_two_ranks_matches_the_published_plan() -> None:
    # The published sibling planner's result on this topology: pools 2-7,18-23 and 10-15,26-31,
    # main 0-33,40-41,48-49,56-57.
    sets = plan_cpu_sets(read_topology(HOSTS / "threadripper-5975wx-cgv2"), ranks=2)
    assert sets.pools_text == "2-7,18-23;10-15,26-31"
    assert sets.main_text == "0-33,40-41,48-49,56-57"
    assert sets.threads_per_rank == 12


def test_threadripper_3970x_keeps_one_core_per_ccx_and_deals_domains() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "threadripper-3970x-cgv2-limit"), ranks=2)
    assert sets.pools_text == "1-3,9-11,17-19,25-27;5-7,13-15,21-23,29-31"
    assert sets.main_text == "0-32,36,40,44,48,52,56,60"


def test_cap_is_split_per_rank_round_robin_across_domains() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "threadripper-3970x-cgv2-limit"), ranks=2, max_threads=6)
    # 3 per rank, one core from each of the rank's domains in turn.
    assert sets.pools == ((1, 9, 17), (5, 13, 21))
    assert sets.threads_per_rank == 3


def test_fewer_domains_than_ranks_splits_flat() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "xeon-2s-cgv1-limit"), ranks=2)
    assert sets.pools_text == "4-9;10-15"
    assert sets.main_text == "0-15,32-35"


def test_desktop_without_smt_loses_no_serving_cpu() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "desktop-8core-cgv1"), ranks=1)
    assert sets.pools_text == "2-7"
    assert sets.main_text == "0-7"


def test_no_pool_when_every_core_serves() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "desktop-8core-cgv1"), ranks=2, max_threads=0)
    assert sets.pools == ((), ())
    assert sets.pools_text == ""
    assert sets.main_text == "0-7"


def test_zero_cap_with_whole_domains_per_rank() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "threadripper-5975wx-cgv2"), ranks=2, max_threads=0)
    assert sets.pools == ((), ())
    assert sets.main_text == "0-63"


EPYC = HOSTS / "epyc-2s-smt-2gpu"


def test_two_socket_epyc_pools_each_rank_on_its_gpus_node() -> None:
    topology = read_topology(EPYC)
    sets = plan_cpu_sets(topology, ranks=2, gpu_nodes=[0, 1])
    assert sets.pools_text == "2-7,10-15,18-23,26-31;34-39,42-47,50-55,58-63"
    assert set(sets.pools[0]) <= set(topology.numa_nodes[0])
    assert set(sets.pools[1]) <= set(topology.numa_nodes[1])
    assert sets.rank_nodes == (0, 1)
    assert sets.placement == "rank 0: GPU on NUMA node 0, pool on node 0; rank 1: GPU on NUMA node 1, pool on node 1"
    # GPUs the other way round: the pools follow them.
    assert plan_cpu_sets(topology, ranks=2, gpu_nodes=[1, 0]).pools_text == (
        "34-39,42-47,50-55,58-63;2-7,10-15,18-23,26-31"
    )


def test_without_gpu_nodes_the_pools_straddle_sockets_and_say_why() -> None:
    sets = plan_cpu_sets(read_topology(EPYC), ranks=2)
    assert sets.pools_text == "2-7,18-23,34-39,50-55;10-15,26-31,42-47,58-63"  # the cross-socket pools
    assert sets.rank_nodes == ()
    assert sets.placement.startswith("not NUMA-placed: the GPUs' NUMA nodes are unknown")
    unknown = plan_cpu_sets(read_topology(EPYC), ranks=2, gpu_nodes=[0, None])
    assert "numa_node -1" in unknown.placement


def test_all_gpus_on_one_node_share_it() -> None:
    sets = plan_cpu_sets(read_topology(EPYC), ranks=2, gpu_nodes=[0, 0])
    assert sets.pools_text == "2-7,18-23;10-15,26-31"
    assert "all GPUs on node 0" in sets.placement


def test_single_socket_host_is_not_numa_placed() -> None:
    sets = plan_cpu_sets(read_topology(HOSTS / "single-socket-24core-2gpu"), ranks=2, gpu_nodes=[None, None])
    assert sets.pools_text == "2-7,18-23;10-15"
    assert sets.placement == "not NUMA-placed: one NUMA node with allowed CPUs: every pool is local to every GPU"


def test_plan_for_the_epyc_host_reads_the_gpus_nodes_from_nvml_and_sysfs() -> None:
    from glm53.host.facts import read_host_facts
    from glm53.host.gpus import read_gpus
    from glm53.plan.inputs.gpus import gpu_spec
    from glm53.plan.inputs.model import load_architecture
    from glm53.plan.vllm.planner import ServingShape, build_plan
    from tests.support.fake_nvml import FakeGpu, FakeNvml

    nvml = FakeNvml(
        gpus=[
            FakeGpu("NVIDIA RTX A6000", 49140, 300, pci_bus_id="00000000:41:00.0"),
            FakeGpu("NVIDIA RTX A6000", 49140, 300, pci_bus_id="00000000:C1:00.0"),
        ]
    )
    gpus = [gpu_spec(gpu, EPYC) for gpu in read_gpus(nvml)]
    assert [(g.pci_bus_id, g.numa_node) for g in gpus] == [("00000000:41:00.0", 0), ("00000000:C1:00.0", 1)]
    plan = build_plan(load_architecture(), read_host_facts(EPYC, gpu_reader=list), gpus, ServingShape())
    assert plan.cpu_sets.pools_text == "2-7,10-15,18-23,26-31;34-39,42-47,50-55,58-63"
    assert plan.cpu_sets.rank_nodes == (0, 1)


def test_gpus_given_by_size_are_not_numa_placed_and_the_plan_says_why() -> None:
    from glm53.host.facts import read_host_facts
    from glm53.plan.inputs.gpus import GpuSpec
    from glm53.plan.inputs.model import load_architecture
    from glm53.plan.vllm.planner import ServingShape, build_plan

    gpus = [GpuSpec(index=i, total_bytes=48 << 30) for i in range(2)]
    plan = build_plan(load_architecture(), read_host_facts(EPYC, gpu_reader=list), gpus, ServingShape())
    assert plan.cpu_sets.placement.startswith("not NUMA-placed: the GPUs' NUMA nodes are unknown (GPUs given by size")
    # A GPU whose PCI device reports numa_node -1.
    gpus = [GpuSpec(index=i, total_bytes=48 << 30, pci_bus_id=f"0000:0{i}:00.0") for i in range(2)]
    plan = build_plan(load_architecture(), read_host_facts(EPYC, gpu_reader=list), gpus, ServingShape())
    assert "numa_node -1" in plan.cpu_sets.placement
