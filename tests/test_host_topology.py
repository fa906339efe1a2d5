"""CPU topology from fixture sysfs trees: packages, SMT siblings, L3 domains, NUMA nodes, allowed CPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.host.topology import format_cpu_list, parse_cpu_list, read_topology

HOSTS = Path(__file__).parent / "fixtures" / "hosts"


def test_threadripper_3970x_eight_l3_domains_with_smt() -> None:
    topo = read_topology(HOSTS / "threadripper-3970x-cgv2-limit")
    assert topo.allowed_cpus == tuple(range(64))
    assert topo.smt
    assert len(topo.physical_cores) == 32
    assert topo.physical_cores[5] == (5, 37)
    assert len(topo.l3_domains) == 8
    assert topo.l3_domains[1] == (4, 5, 6, 7, 36, 37, 38, 39)
    assert topo.packages == (tuple(range(64)),)
    assert topo.numa_nodes == {0: tuple(range(64))}


def test_desktop_without_smt_skips_the_l1_entry() -> None:
    topo = read_topology(HOSTS / "desktop-8core-cgv1")
    assert not topo.smt
    assert topo.l3_domains == (tuple(range(8)),)
    assert topo.cpu(3).siblings == (3,)
    assert topo.cpu(3).l3_domain == tuple(range(8))


def test_two_socket_xeon_restricted_by_cpuset() -> None:
    topo = read_topology(HOSTS / "xeon-2s-cgv1-limit")
    assert topo.allowed_cpus == (*range(16), *range(32, 48))
    assert len(topo.packages) == 1  # only socket 0 is allowed
    assert topo.l3_domains == ((*range(16), *range(32, 48)),)
    assert topo.numa_nodes[1] == ()
    assert topo.cpu(33).siblings == (1, 33)
    assert topo.cpu(33).numa_node == 0


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
        ("5", (5,)),
        ("", ()),
        ("2-7,18-23\n", (*range(2, 8), *range(18, 24))),
    ],
)
def test_cpu_list_round_trip(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


def test_cpu_list_errors_name_the_item() -> None:
    with pytest.raises(BadInput, match="'x'"):
        parse_cpu_list("0-3,x")
    with pytest.raises(BadInput, match="backwards"):
        parse_cpu_list("7-2")


def test_missing_sysfs_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        read_topology(tmp_path)


def test_fixture_trees_match_their_generator(tmp_path: Path) -> None:
    from tests.fixtures.hosts.make_host_fixtures import MACHINES, build

    for machine in MACHINES:
        build(machine, tmp_path)
        generated = {
            p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / machine.name).rglob("*") if p.is_file()
        }
        committed = {p.relative_to(HOSTS): p.read_bytes() for p in (HOSTS / machine.name).rglob("*") if p.is_file()}
        assert generated == committed, machine.name


def test_two_socket_epyc_has_two_nodes_and_a_gpu_on_each() -> None:
    from glm53.host.topology import pci_device_numa_node

    root = HOSTS / "epyc-2s-smt-2gpu"
    topo = read_topology(root)
    assert len(topo.packages) == 2 and topo.smt and len(topo.l3_domains) == 8
    assert {node: format_cpu_list(cpus) for node, cpus in topo.numa_nodes.items()} == {
        0: "0-31,64-95",
        1: "32-63,96-127",
    }
    # NVML's bus id (8-digit domain, upper case) finds sysfs's device.
    assert pci_device_numa_node(root, "00000000:41:00.0") == 0
    assert pci_device_numa_node(root, "00000000:C1:00.0") == 1
    assert pci_device_numa_node(root, "00000000:99:00.0") is None  # no such device
    assert pci_device_numa_node(root, "not a bus id") is None


def test_single_socket_gpu_without_proximity_reads_as_unknown() -> None:
    from glm53.host.topology import pci_device_numa_node

    root = HOSTS / "single-socket-24core-2gpu"
    topo = read_topology(root)
    assert list(topo.numa_nodes) == [0] and len(topo.l3_domains) == 3
    assert pci_device_numa_node(root, "00000000:01:00.0") is None  # the kernel's -1


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [("00000000:41:00.0", "0000:41:00.0"), ("0000:C1:00.0", "0000:c1:00.0"), ("41:00.0", "0000:41:00.0")],
)
def test_sysfs_bus_id(nvml: str, sysfs: str) -> None:
    from glm53.host.topology import sysfs_bus_id

    assert sysfs_bus_id(nvml) == sysfs
