"""A GPU profile served without --plan-env is planned on the host first, as the recipe's entrypoint did; the
dry run shows exactly what that start execs (argv, environment, CPU affinity), and says so where it cannot."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import glm53.serve.exec
from glm53.errors import Unavailable
from glm53.host.topology import parse_cpu_list
from glm53.output import Output
from glm53.plan.vllm.env import PLANNED_KEYS
from glm53.recipe.profiles import load_profile
from glm53.serve import start
from glm53.serve.exec import EngineProcess
from glm53.serve.resolve import PLAN_THIS_HOST, ServeRequest, plan_on_this_host, resolve_launch
from tests.support.cli import run_glm53
from tests.support.fake_nvml import FakeNvml, two_3090s
from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
THREADRIPPER = HOSTS / "threadripper-5975wx-cgv2"


@pytest.fixture
def recipe_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML as pynvml speaks it, with the recipe's two RTX 3090s."""
    monkeypatch.setitem(sys.modules, "pynvml", two_3090s())


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error="Driver Not Loaded"))


def test_the_recipe_rig_plan_layers_over_the_profile(tmp_path: Path, recipe_gpus: None) -> None:
    profile = load_profile("agent-256k", environ={})
    values, plan_input = plan_on_this_host(profile, None, root=THREADRIPPER)

    planned = {key: value for key, value, _ in values}
    assert {source for _, _, source in values} == {PLAN_THIS_HOST}
    # The planner's figures replace the profile's recipe defaults (CPU_OFFLOAD_GB=64, EXL3_PINNED_FRAC=0.2).
    assert planned["CPU_OFFLOAD_GB"] != profile.value("CPU_OFFLOAD_GB")
    assert int(planned["KV_CACHE_MEMORY_BYTES"]) > 0
    layers = planned["EXL3_LRU_CAPACITY_PLAN"].split(",")
    assert len(layers) == 42 and layers[0].startswith("3:")

    launch = resolve_launch(ServeRequest(root=THREADRIPPER), need_model=False)
    assert launch.plan.source == "this host"
    assert launch.profile.settings["CPU_OFFLOAD_GB"].origin == "plan"
    assert launch.profile.settings["CPU_OFFLOAD_GB"].source == PLAN_THIS_HOST
    argv = launch.spec.argv
    assert argv[argv.index("--cpu-offload-gb") + 1] == planned["CPU_OFFLOAD_GB"]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == planned["KV_CACHE_MEMORY_BYTES"]
    assert launch.spec.env["EXL3_LRU_CAPACITY_PLAN"] == planned["EXL3_LRU_CAPACITY_PLAN"]
    # Serving CPUs: the published split of this Threadripper (pool cores' SMT siblings left out).
    assert launch.spec.cpu_affinity == list(parse_cpu_list("0-33,40-41,48-49,56-57", what="expected"))
    assert plan_input.env["HYBRID_MAIN_CPUS"] == "0-33,40-41,48-49,56-57"
    assert set(launch.plan.keys) <= set(PLANNED_KEYS)


class _Exec(Exception):
    pass


def test_dry_run_json_is_exactly_what_the_engine_receives(
    tmp_path: Path, recipe_gpus: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_tiny_glm53_checkpoint(tmp_path / "model")
    # The tiny checkpoint has 4,096 positions.
    req = ServeRequest(
        profile="agent-256k",
        model_dir=model,
        root=THREADRIPPER,
        set_values=["MAX_MODEL_LEN=4096"],
        skip_preflight=True,
        skip_flag_check=True,
    )
    Output(json_mode=True).result(start.dry_run(req, Output(json_mode=True)), lambda console: None)
    shown = json.loads(capsys.readouterr().out)

    received: dict[str, Any] = {}

    def fake_execve(program: str, argv: list[str], env: dict[str, str]) -> None:
        received.update(program=program, argv=argv, env=env)
        raise _Exec

    monkeypatch.setattr(glm53.serve.exec.os, "execve", fake_execve)
    monkeypatch.setattr(glm53.serve.exec.os, "sched_setaffinity", lambda pid, cpus: received.update(cpus=cpus))
    with pytest.raises(_Exec):
        start.start(req.model_copy(update={"exec_in_place": True}), Output())
    # Without --exec the same process is run as glm53's child.
    supervised: list[EngineProcess] = []

    def fake_supervise(process: EngineProcess, *args: object) -> int:
        supervised.append(process)
        raise _Exec

    monkeypatch.setattr(start, "supervise", fake_supervise)
    with pytest.raises(_Exec):
        start.start(req, Output())
    (child,) = supervised
    assert (child.program, child.argv, child.env) == (received["program"], received["argv"], received["env"])
    assert child.cpu_affinity == list(received["cpus"])

    launch = shown["launch"]
    assert received["argv"] == launch["argv"] and received["program"] == launch["argv"][0]
    exported = {k: v for k, v in received["env"].items() if os.environ.get(k) != v}
    assert exported == launch["env"]
    assert list(received["cpus"]) == launch["cpu_affinity"] and launch["cpu_affinity"]
    assert shown["plan"]["source"] == "this host"
    # Every planned value shows its origin, in the table of values and in the launch's origins.
    for key in ("CPU_OFFLOAD_GB", "KV_CACHE_MEMORY_BYTES", "EXL3_LRU_CAPACITY_PLAN", "OMP_NUM_THREADS"):
        assert shown["values"][key]["source"] == PLAN_THIS_HOST
    assert launch["origins"]["EXL3_LRU_CAPACITY_PLAN"] == PLAN_THIS_HOST
    assert launch["origins"]["EXL3_HYBRID_CPU"] == PLAN_THIS_HOST


def test_dry_run_without_a_gpu_says_what_would_be_planned(no_gpu: None) -> None:
    result = run_glm53("serve", "--profile", "agent-256k", "--dry-run", "--json", "--skip-flag-check")
    assert result.code == 0, result.stderr
    plan = result.json()["plan"]
    assert plan["source"] == "impossible" and "no NVIDIA GPU" in plan["detail"]
    assert plan["keys"] == list(PLANNED_KEYS)

    human = run_glm53("serve", "--profile", "agent-256k", "--dry-run", "--skip-flag-check")
    text = " ".join(human.stdout.split())
    assert "cannot plan on this host" in text and "EXL3_LRU_CAPACITY_PLAN" in text


def test_a_real_start_without_a_gpu_stops_with_exit_3(tmp_path: Path, no_gpu: None) -> None:
    model = write_tiny_glm53_checkpoint(tmp_path / "model")
    with pytest.raises(Unavailable, match="no NVIDIA GPU"):
        start.start(ServeRequest(model_dir=model, skip_preflight=True, skip_flag_check=True), Output())


def test_a_cpu_profile_needs_no_plan() -> None:
    launch = resolve_launch(ServeRequest(profile="cpu-tiny"), need_model=False)
    assert launch.plan.source == "not needed" and launch.spec.cpu_affinity is None


def test_profile_check_resolves_the_launch_without_reading_this_host() -> None:
    result = run_glm53("profile", "check", "--profile", "agent-256k", "--json", "--set", "MAX_MODEL_LEN=131072")
    assert result.code == 0, result.stderr
    data = result.json()
    assert data["plan"]["source"] == "not planned"
    assert data["argv"][data["argv"].index("--max-model-len") + 1] == "131072"
    refused = run_glm53("profile", "check", "--host", "0.0.0.0")
    assert refused.code == 2 and "--listen-all" in refused.stderr
    assert run_glm53("profile", "check", "--host", "0.0.0.0", "--listen-all").code == 0


def test_triton_is_pointed_at_the_drivers_libcuda_where_this_host_has_it(tmp_path: Path, recipe_gpus: None) -> None:
    import shutil

    from glm53.host.native_libs import find_system_library, read_loader_view

    libc = find_system_library("libc.so.6", read_loader_view())
    assert libc is not None
    shutil.copy(libc, tmp_path / "libcuda.so.1")  # a real ELF library of this machine, named as the driver's
    environ = {"LD_LIBRARY_PATH": str(tmp_path)}
    launch = resolve_launch(ServeRequest(root=THREADRIPPER), need_model=False, environ=environ)
    assert launch.spec.env["TRITON_LIBCUDA_PATH"] == str(tmp_path)
    assert launch.spec.origins["TRITON_LIBCUDA_PATH"] == f"this host ({tmp_path / 'libcuda.so.1'})"
    preset = resolve_launch(
        ServeRequest(root=THREADRIPPER), need_model=False, environ={**environ, "TRITON_LIBCUDA_PATH": "/x"}
    )
    assert "TRITON_LIBCUDA_PATH" not in preset.spec.env  # the user's own value is inherited untouched
    cpu = resolve_launch(ServeRequest(profile="cpu-tiny"), need_model=False, environ=environ)
    assert "TRITON_LIBCUDA_PATH" not in cpu.spec.env


@pytest.mark.parametrize(
    ("profile", "text", "message"),
    [
        ("exl3-2x3090", "GPU_SPLIT=23,23\nFOO_BAR=1\n", ":2: unknown key 'FOO_BAR'"),
        ("exl3-2x3090", "GPU_SPLIT=23,23\nGPU_SPLIT=22,22\n", ":2: GPU_SPLIT is set again (first at line 1)"),
        (
            "exl3-2x3090",
            "GPU_SPLIT=23,23\nHYBRID_MAIN_CPUS=0-3\n",
            ":2: HYBRID_MAIN_CPUS is written by the vllm planner, and this profile runs on exllamav3",
        ),
        ("exl3-2x3090", "CPU_OFFLOAD_GB=54\n", "CPU_OFFLOAD_GB is read by vllm only"),
        ("agent-256k", "CPU_OFFLOAD_GB=54\nGPU_SPLIT=23,23\n", "GPU_SPLIT"),
        ("agent-256k", "CPU_OFFLOAD_GB=54\nCPU_OFFLOAD_GB=50\n", ":2: CPU_OFFLOAD_GB is set again"),
    ],
)
def test_a_bad_plan_env_names_the_line_and_loses_nothing(tmp_path: Path, profile: str, text: str, message: str) -> None:
    plan = tmp_path / "plan.env"
    plan.write_text(text)
    result = run_glm53("serve", "--profile", profile, "--plan-env", str(plan), "--dry-run")
    assert result.code == 2, (result.stdout, result.stderr)
    assert message in result.stderr and str(plan) in result.stderr
    assert plan.read_text() == text  # the user's file is never rewritten


def test_a_plan_written_by_the_planner_is_accepted_back(tmp_path: Path) -> None:
    plan = tmp_path / "plan.env"
    made = run_glm53("plan", "host", "--profile", "exl3-2x3090", "--rig", "recipe-2x3090", "--env")
    assert made.code == 0, made.stderr
    plan.write_text(made.stdout)
    result = run_glm53("serve", "--profile", "exl3-2x3090", "--plan-env", str(plan), "--dry-run", "--json")
    assert result.code == 0, result.stderr
