"""`glm53 plan host` for a rig that is not this machine: a packaged rig (`--rig recipe-2x3090`), a rig file, or
`--ram`, `--cpus` and `--gpu-memory`; each equals planning on that machine itself (its saved /proc and /sys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.host.memory import read_host_memory
from glm53.host.rig import load_rig, rig_names, rig_topology
from glm53.host.topology import read_topology
from glm53.plan.inputs.machine import CpuLayout, parse_cpus
from tests.support.cli import run_glm53

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
RECIPE_HOST = HOSTS / "threadripper-5975wx-cgv2"


def test_the_recipe_rig_is_the_recipe_machine() -> None:
    rig = load_rig("recipe-2x3090")
    assert "recipe-2x3090" in rig_names()
    assert [gpu.memory_bytes for gpu in rig.gpus] == [24 << 30, 24 << 30]
    real, synthetic = read_topology(RECIPE_HOST), rig_topology(rig)
    assert synthetic.l3_domains == real.l3_domains and synthetic.packages == real.packages
    assert synthetic.physical_cores == real.physical_cores and synthetic.numa_nodes == real.numa_nodes
    assert [(c.cpu, c.core_id, c.siblings, c.l3_domain) for c in synthetic.cpus] == [
        (c.cpu, c.core_id, c.siblings, c.l3_domain) for c in real.cpus
    ]
    assert parse_cpus("32cx2t/8").topology() == synthetic
    # Its RAM is the DIMMs' 128 GiB; Linux reports a little less as MemTotal, which the plan rounds up again.
    assert rig.ram_bytes == 128 << 30 > read_host_memory(RECIPE_HOST).mem_total_bytes


def test_planning_for_the_rig_from_any_machine_equals_planning_on_it() -> None:
    on_it = run_glm53("plan", "host", "--gpu-memory", "24GiB,24GiB", "--host-root", str(RECIPE_HOST), "--env")
    assert on_it.code == 0, on_it.stderr
    rig = run_glm53("plan", "host", "--rig", "recipe-2x3090", "--env")
    assert rig.code == 0, rig.stderr
    assert rig.stdout == on_it.stdout
    assert "planned for rig recipe-2x3090: NVIDIA GeForce RTX 3090 24 GiB" in rig.stderr
    # The same target from options, on a small machine's facts: its RAM and CPUs no longer count.
    options = run_glm53(
        "plan", "host", "--gpu-memory", "24GiB,24GiB", "--ram", "128GiB", "--cpus", "32cx2t/8",
        "--host-root", str(HOSTS / "desktop-8core-cgv1"), "--env",
    )  # fmt: skip
    assert options.code == 0, options.stderr
    assert options.stdout == on_it.stdout
    plan = run_glm53(
        "plan", "host", "--rig", "recipe-2x3090", "--profile", "agent-256k", "--max-model-len", "131072", "--json"
    )
    assert plan.code == 0, plan.stderr
    payload = plan.json()
    assert payload["target"].startswith("rig recipe-2x3090") and payload["shape"]["max_model_len"] == 131072


def test_this_machine_s_ram_is_named_with_the_way_out() -> None:
    small = run_glm53("plan", "host", "--gpu-memory", "24GiB,24GiB", "--host-root", str(HOSTS / "desktop-8core-cgv1"))
    assert small.code == 1 and "infeasible: host memory" in small.stderr
    assert "this is this machine's RAM" in small.stderr and "--rig recipe-2x3090" in small.stderr
    too_small = run_glm53("plan", "host", "--rig", "recipe-2x3090", "--ram", "32GiB")
    assert too_small.code == 1 and "this machine's RAM" not in too_small.stderr, "the target's RAM was given"


@pytest.mark.parametrize(
    ("text", "layout"),
    [
        ("32cx2t/8", CpuLayout(sockets=1, cores_per_socket=32, threads_per_core=2, cores_per_l3=8)),
        ("16c", CpuLayout(sockets=1, cores_per_socket=16)),
        ("2x64cx2t", CpuLayout(sockets=2, cores_per_socket=64, threads_per_core=2)),
    ],
)
def test_cpus_option(text: str, layout: CpuLayout) -> None:
    assert parse_cpus(text) == layout


@pytest.mark.parametrize(("text", "says"), [("8", "is not CORESc"), ("32c/5", "do not divide"), ("0c", "--cpus")])
def test_bad_cpus_are_named(text: str, says: str) -> None:
    with pytest.raises(BadInput, match="--cpus") as exc:
        parse_cpus(text)
    assert says in exc.value.message


def test_rig_files_and_their_errors(tmp_path: Path) -> None:
    rig = load_rig("recipe-2x3090").model_dump(mode="json")
    rig.update(name="one-4090", gpus=[{"name": "NVIDIA GeForce RTX 4090", "memory_bytes": 24 << 30}], cores=16)
    rig["cores_per_l3"] = 8
    good = tmp_path / "one-4090.json"
    good.write_text(json.dumps(rig))
    result = run_glm53("plan", "host", "--rig", str(good), "--tp", "1", "--json")
    assert result.code == 0, result.stderr
    assert "rig one-4090" in result.stderr and len(result.json()["gpus"]) == 1
    for name, change, says in [
        ("extra.json", {"colour": "red"}, "colour"),
        ("ram.json", {"ram_bytes": "lots"}, "ram_bytes"),
        ("l3.json", {"cores_per_l3": 0}, "cores_per_l3"),
    ]:
        bad = tmp_path / name
        bad.write_text(json.dumps({**rig, **change}))
        failed = run_glm53("plan", "host", "--rig", str(bad))
        assert failed.code == 2 and str(bad) in failed.stderr and says in failed.stderr, failed.stderr
    missing = run_glm53("plan", "host", "--rig", "recipe-9x5090")
    assert missing.code == 2 and "recipe-2x3090" in missing.stderr
