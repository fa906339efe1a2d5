"""CPU pools and the serving set on fixture topologies."""

from __future__ import annotations

from pathlib import Path

from glm53.host.topology import read_topology
from glm53.plan.cpu_pools import plan_cpu_sets

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
