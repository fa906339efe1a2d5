"""Host memory from fixture /proc and cgroup trees shaped like real machines."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.host.memory import read_cgroup_memory_limit, read_host_memory, read_meminfo

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
GIB = 1 << 30


def test_cgroup_v2_limit_below_memtotal() -> None:
    memory = read_host_memory(HOSTS / "threadripper-3970x-cgv2-limit")
    assert memory.mem_total_bytes == 131_889_524 * 1024
    assert memory.mem_available_bytes == 127_001_112 * 1024
    assert memory.cgroup_version == 2
    assert memory.cgroup_limit_bytes == 96 * GIB
    assert memory.effective_limit_bytes == 96 * GIB
    assert memory.cgroup_limit_source == "/sys/fs/cgroup/system.slice/glm53.service/memory.max"


def test_cgroup_v2_max_means_no_limit() -> None:
    memory = read_host_memory(HOSTS / "threadripper-5975wx-cgv2")
    assert memory.cgroup_version == 2
    assert memory.cgroup_limit_bytes is None
    assert memory.effective_limit_bytes == memory.mem_total_bytes


def test_cgroup_v1_page_rounded_2_63_means_no_limit() -> None:
    memory = read_host_memory(HOSTS / "desktop-8core-cgv1")
    assert memory.cgroup_version == 1
    assert memory.cgroup_limit_bytes is None
    assert memory.effective_limit_bytes == 32_735_248 * 1024


def test_cgroup_v1_container_limit_at_mount_root() -> None:
    # /proc/self/cgroup names /docker/3f1c, but inside the container the limit sits at the mount root.
    memory = read_host_memory(HOSTS / "xeon-2s-cgv1-limit")
    assert memory.cgroup_version == 1
    assert memory.cgroup_limit_bytes == 100 * GIB
    assert memory.effective_limit_bytes == 100 * GIB
    assert memory.cgroup_limit_source == "/sys/fs/cgroup/memory/memory.limit_in_bytes"


def test_tighter_parent_limit_binds(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal:       65536000 kB\nMemAvailable:   60000000 kB\n")
    (tmp_path / "proc/self/cgroup").write_text("0::/machine.slice/app.scope\n")
    cgroup = tmp_path / "sys/fs/cgroup"
    (cgroup / "machine.slice/app.scope").mkdir(parents=True)
    (cgroup / "cgroup.controllers").write_text("memory pids\n")
    (cgroup / "machine.slice/memory.max").write_text(f"{20 * GIB}\n")
    (cgroup / "machine.slice/app.scope/memory.max").write_text(f"{30 * GIB}\n")
    version, limit, source = read_cgroup_memory_limit(tmp_path)
    assert (version, limit, source) == (2, 20 * GIB, "/sys/fs/cgroup/machine.slice/memory.max")


def test_no_cgroup_mounted(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       1024 kB\n")
    memory = read_host_memory(tmp_path)
    assert (memory.cgroup_version, memory.cgroup_limit_bytes, memory.effective_limit_bytes) == (
        None,
        None,
        1 << 20,
    )
    assert memory.mem_available_bytes is None


def test_missing_or_malformed_meminfo_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="proc/meminfo"):
        read_meminfo(tmp_path)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemFree: 12 kB\n")
    with pytest.raises(BadInput, match="no MemTotal"):
        read_meminfo(tmp_path)
