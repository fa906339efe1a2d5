"""The env formats, and the entrypoint's one call: a profile on this host -> env + CPU affinity."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.errors import BadInput, Unavailable
from glm53.host.facts import read_host_facts
from glm53.host.gpus import read_gpus
from glm53.plan.files import env_lines
from glm53.plan.inputs.gpus import GpuSpec, gpu_spec
from glm53.plan.vllm.env import parse_capacity_plan, plan_serving_env
from glm53.recipe.profiles import load_profile
from tests.support.fake_nvml import FakeNvml, two_3090s

HOSTS = Path(__file__).parent / "fixtures" / "hosts"


def test_capacity_plan_parsing() -> None:
    assert parse_capacity_plan("3:75:10,4:74") == {3: (75, 10), 4: (74, 0)}
    with pytest.raises(BadInput, match="pins 9 of only 8"):
        parse_capacity_plan("3:8:9")
    with pytest.raises(BadInput, match="appears twice"):
        parse_capacity_plan("3:8,3:9")
    with pytest.raises(BadInput, match="'3-8'"):
        parse_capacity_plan("3-8")


def test_env_lines_quote_for_the_shell() -> None:
    assert env_lines({"A": "1", "B": "2-7;10-15"}) == "A=1\nB='2-7;10-15'\n"


def _gpus_from(nvml: FakeNvml) -> list[GpuSpec]:
    """The planner's GPUs as it reads them: NVML through the host facts."""
    facts = read_host_facts(
        HOSTS / "threadripper-5975wx-cgv2", gpu_reader=lambda: read_gpus(nvml), engine_libraries=None
    )
    return [gpu_spec(gpu) for gpu in facts.gpus]


def test_profile_on_the_recipe_host_through_nvml() -> None:
    gpus = _gpus_from(two_3090s())
    assert [g.total_bytes for g in gpus] == [24576 << 20, 24576 << 20]
    assert gpus[0].used_bytes == 300 << 20
    env, cpus = plan_serving_env(load_profile("agent-256k"), gpus=gpus, root=HOSTS / "threadripper-5975wx-cgv2")
    assert env["KV_CACHE_MEMORY_BYTES"] == "3328599040"
    assert env["CPU_OFFLOAD_GB"] == "54"
    assert env["HYBRID_MAIN_CPUS"] == "0-33,40-41,48-49,56-57"
    assert cpus == (*range(34), 40, 41, 48, 49, 56, 57)


def test_no_gpu_asks_for_flags() -> None:
    assert _gpus_from(FakeNvml(init_error="Driver Not Loaded")) == []
    with pytest.raises(Unavailable, match="no NVIDIA GPU") as info:
        plan_serving_env(load_profile("agent-256k"), gpus=[], root=HOSTS / "threadripper-5975wx-cgv2")
    assert info.value.fix is not None and "--gpu-memory" in info.value.fix
