"""Doctor: facts from fixture /proc, /sys and /dev/shm trees shaped like real machines, GPUs through a
stand-in for pynvml, real resource limits and a real bound port; checks are pure functions over the facts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from glm53.host.gpus import NoGpu, read_gpus
from glm53.preflight.doctor import (
    DoctorFacts,
    DoctorReport,
    audit_host,
    limits_from_lock,
    load_limits,
    read_facts,
    requirements_for,
    run_checks,
)
from glm53.recipe.profiles import load_profile
from tests.support.cli import run_glm53
from tests.support.fake_nvml import FakeGpu, FakeNvml, two_3090s
from tests.support.server import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"


def _facts(tree: str, nvml: FakeNvml | None = None, **kwargs: object) -> DoctorFacts:
    fake = nvml if nvml is not None else FakeNvml(init_error="NVML Shared Library Not Found")
    return read_facts(FIXTURES / tree, gpu_reader=lambda: read_gpus(fake), machine="x86_64", **kwargs)  # type: ignore[arg-type]


def test_thresholds_come_from_the_repro_lock() -> None:
    from glm53.recipe.pins import load_repro_lock

    lock = load_repro_lock()
    limits = limits_from_lock(lock)
    assert limits.driver_min == int(lock.engine.cuda.vllm.driver_min) == 580  # CUDA 13.0, the vendor image
    assert limits.capabilities == [(8, 6)] and limits.runs_on((8, 9)) and not limits.runs_on((8, 0))
    assert not limits.runs_on((9, 0))  # no PTX in the recipe's sm_86 kernels
    # The exllamav3 engine is nixpkgs' CUDA 12.8 (driver 570+): sm_80 kernels, sm_86 with its PTX for newer GPUs.
    exl3 = limits_from_lock(lock, "exllamav3")
    assert (exl3.driver_min, exl3.cuda_version) == (570, "12.8")
    assert exl3.capabilities == [(8, 0), (8, 6)] and exl3.ptx == (8, 6)
    assert exl3.runs_on((8, 0)) and exl3.runs_on((8, 9)) and exl3.runs_on((9, 0)) and exl3.runs_on((12, 0))
    assert not exl3.runs_on((7, 5))
    assert limits.gpu_memory_bytes == lock.hardware.gpu_memory_mib << 20
    newer = limits.model_copy(update={"driver_min": 600})
    facts = _facts("gpu-host", two_3090s())
    checks = _by_name(run_checks(facts, requirements_for(load_profile("agent-256k", environ={})), newer))
    assert checks["nvidia driver"][0] == "fail" and "need >= 600" in checks["nvidia driver"][1]


def test_host_audit_is_the_same_engine_with_the_validated_hardware() -> None:
    limits = load_limits()
    rig = _facts("gpu-host", two_3090s()).host
    assert audit_host(rig, limits).ok
    h200 = FakeNvml(gpus=[FakeGpu("NVIDIA H200", 143771, 0, capability=(9, 0))], driver="575.57.08")
    report = audit_host(_facts("gpu-host", h200).host, limits)
    assert {c.name for c in report.failures} == {"gpu count", "nvidia driver", "gpu 0", "gpu model"}
    assert all(c.fix for c in report.failures)
    bare = audit_host(_facts("old-desktop").host, limits)
    assert {c.name for c in bare.failures} >= {"gpus", "system memory"}


def test_host_audit_compares_the_host_with_the_engine_it_will_run(tmp_path: Path) -> None:
    from glm53.preflight.doctor import read_container_facts

    # Driver 575 runs nixpkgs' CUDA 12.8 (the exllamav3 engine), not the vendor image's CUDA 13 (vLLM).
    rig = _facts("gpu-host", FakeNvml(gpus=two_3090s().gpus, driver="575.57.08")).host
    exl3 = audit_host(rig, load_limits("exllamav3"))
    assert exl3.ok and "CUDA 12.8" in _by_name(exl3)["engine"][1]
    vllm = audit_host(rig, load_limits("vllm"), read_container_facts(tmp_path, which=lambda name: None))
    assert {c.name for c in vllm.failures} == {"nvidia driver", "container runtime", "nvidia cdi"}
    assert "need >= 580 for CUDA 13.0.1" in _by_name(vllm)["nvidia driver"][1]
    assert "nvidia-container-toolkit" in str(_by_name(vllm)["nvidia cdi"][2])
    # The vendor image runs where a runtime and the toolkit's CDI specification are (NixOS writes it here).
    cdi = tmp_path / "var" / "run" / "cdi"
    cdi.mkdir(parents=True)
    (cdi / "nvidia-container-toolkit.json").write_text('{"kind": "nvidia.com/gpu", "devices": []}')
    (cdi / "other.json").write_text('{"kind": "vendor.example/fpga"}')
    ready = read_container_facts(tmp_path, which=lambda name: f"/usr/bin/{name}" if name == "podman" else None)
    assert ready.runtimes == ["podman"] and ready.cdi_specs == ["/var/run/cdi/nvidia-container-toolkit.json"]
    assert audit_host(_facts("gpu-host", two_3090s()).host, load_limits("vllm"), ready).ok


def _report(facts: DoctorFacts, profile: str) -> DoctorReport:
    loaded = load_profile(profile, environ={})
    return run_checks(facts, requirements_for(loaded), load_limits(loaded.engine), profile=profile)


def _by_name(report: DoctorReport) -> dict[str, tuple[str, str, str | None]]:
    return {c.name: (c.status, c.detail, c.fix) for c in report.checks}


def test_gpu_host_is_ready_for_the_recipe() -> None:
    facts = _facts("gpu-host", two_3090s())
    assert facts.host.memory is not None and facts.host.memory.cgroup_limit_bytes == 120 << 30
    report = _report(facts, "agent-256k")
    checks = _by_name(report)
    assert report.ok, [c for c in report.checks if c.status == "fail"]
    assert checks["gpu count"][0] == "ok" and "2 GPU(s)" in checks["gpu count"][1]
    assert checks["nvidia driver"][0] == "ok" and "580.95.05" in checks["nvidia driver"][1]
    assert checks["gpu 0"][0] == "ok" and "sm_86" in checks["gpu 0"][1] and "24,576 MiB total" in checks["gpu 0"][1]
    assert checks["memlock"] == ("ok", "unlimited", None)
    assert checks["host memory"][0] == "ok" and "cgroup v2 limit 120.0 GiB" in checks["host memory"][1]
    assert checks["cpu features"] == ("ok", "AVX2, FMA, F16C", None)
    assert checks["kernel"][0] == "ok" and checks["transparent hugepages"][1] == "madvise"


def test_stale_shared_memory_is_found_and_live_segments_are_not() -> None:
    facts = _facts("gpu-host", two_3090s())
    by_name = {s.name: s.in_use for s in facts.host.shm_segments}
    assert by_name == {
        "psm_3f9a1c2e": True,
        "psm_77d0a4b1": False,
    }  # pulse-shm-* is not ours
    stale = _by_name(_report(facts, "agent-256k"))["stale shm segments"]
    assert stale[0] == "warn" and "psm_77d0a4b1" in stale[1] and "psm_3f9a1c2e" not in stale[1]
    assert stale[2] == "rm /dev/shm/psm_77d0a4b1"


def test_open_file_descriptor_keeps_a_segment_in_use(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "gpu-host", root)
    (root / "proc/2231/fd").mkdir(parents=True)
    os.symlink("/dev/shm/psm_77d0a4b1", root / "proc/2231/fd/9")
    facts = read_facts(root, gpu_reader=lambda: read_gpus(two_3090s()), machine="x86_64")
    assert all(s.in_use for s in facts.host.shm_segments)


def test_busy_gpu_and_old_driver() -> None:
    report = _report(_facts("gpu-host", two_3090s(used_mib=1900, driver="550.127.05")), "agent-256k")
    checks = _by_name(report)
    assert checks["gpu 0"][0] == "warn" and "1,900 MiB already in use" in checks["gpu 0"][1]
    assert "nvidia-smi" in (checks["gpu 0"][2] or "")
    assert checks["gpu 1"][0] == "ok"
    assert checks["nvidia driver"][0] == "fail" and "580" in (checks["nvidia driver"][2] or "")
    assert not report.ok


def test_one_small_old_gpu() -> None:
    nvml = FakeNvml(gpus=[FakeGpu("Tesla T4", 15360, 0, capability=(7, 5))])
    checks = _by_name(_report(_facts("gpu-host", nvml), "agent-256k"))
    assert checks["gpu count"][0] == "fail" and "needs 2" in checks["gpu count"][1]
    assert checks["gpu 0"][0] == "fail" and "built for sm_86, not sm_75" in checks["gpu 0"][1]


def test_old_desktop_fails_with_a_fix_for_each_problem() -> None:
    report = _report(_facts("old-desktop"), "agent-256k")
    checks = _by_name(report)
    assert checks["gpus"][0] == "fail" and "NVML Shared Library Not Found" in checks["gpus"][1]
    assert "--profile cpu-tiny" in (checks["gpus"][2] or "")
    assert checks["memlock"][0] == "fail" and checks["memlock"][1].startswith("8.0 MiB")
    assert "memlock=-1" in (checks["memlock"][2] or "")
    assert checks["cpu features"][0] == "fail" and checks["cpu features"][1] == "missing AVX2, FMA, F16C"
    assert checks["kernel"][0] == "fail" and "5.10.0-32-amd64" in checks["kernel"][1]
    assert checks["transparent hugepages"][0] == "warn"
    assert checks["host memory"][0] == "fail" and "no cgroup limit" in checks["host memory"][1]
    assert all(c.fix for c in report.failures)


def test_without_a_gpu_the_cpu_profile_still_passes_gpu_and_memlock() -> None:
    checks = _by_name(_report(_facts("old-desktop"), "cpu-tiny"))
    assert checks["gpus"][0] == "ok" and "runs on the CPU" in checks["gpus"][1]
    assert checks["memlock"][0] == "ok" and "pins no host memory" in checks["memlock"][1]


def test_port_in_use_is_a_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        checks = _by_name(_report(_facts("gpu-host", two_3090s(), port=port), "cpu-tiny"))
    assert checks["port"][0] == "fail" and "in use" in checks["port"][1]
    assert f":{port}" in (checks["port"][2] or "")


def test_nvml_errors_become_plain_reasons() -> None:
    with pytest.raises(NoGpu, match="cannot start"):
        read_gpus(FakeNvml(init_error="Driver Not Loaded"))
    empty = FakeNvml()
    with pytest.raises(NoGpu, match="sees no GPU"):
        read_gpus(empty)
    assert empty.calls == ["init", "shutdown"]
    gpus = read_gpus(two_3090s())
    assert [g.index for g in gpus] == [0, 1] and gpus[0].memory_free_bytes == (24576 - 300) << 20


def test_real_host_memlock_comes_from_resource_limits(tmp_path: Path) -> None:
    # Lower the real RLIMIT_MEMLOCK in a child and let doctor read the real /proc/self/limits there.
    code = (
        "import resource, json; resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536)); "
        "from glm53.host.facts import read_memlock; from pathlib import Path; "
        "print(json.dumps(read_memlock(Path('/'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[65536, true]"


def test_cli_json_and_exit_codes() -> None:
    ok = run_glm53(
        "doctor",
        "--profile",
        "cpu-tiny",
        "--host-root",
        str(FIXTURES / "gpu-host"),
        "--port",
        str(free_port()),
        "--json",
    )
    data = ok.json()
    assert ok.code == 0 and data["ok"] is True
    assert {c["name"] for c in data["checks"]} >= {
        "gpus",
        "memlock",
        "/dev/shm",
        "kernel",
        "cpu features",
    }
    bad = run_glm53(
        "doctor",
        "--profile",
        "agent-256k",
        "--host-root",
        str(FIXTURES / "old-desktop"),
        "--port",
        str(free_port()),
    )
    assert bad.code == 1
    assert "memlock" in bad.stdout and "failed" in bad.stdout
    typo = run_glm53("doctor", "--profile", "agent256k")
    assert typo.code == 2 and "agent-256k" in typo.stderr


def test_model_dir_verified_through_the_lock(tmp_path: Path) -> None:
    from glm53.checkpoint.lock import default_lock_path, lock_from_directory, write_lock

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    unlocked = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=model), "cpu-tiny"))
    assert unlocked["model verified"][0] == "fail" and "lock not found" in unlocked["model verified"][1]
    write_lock(lock_from_directory(model), default_lock_path(model))
    locked = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=model), "cpu-tiny"))
    assert locked["model verified"][0] == "ok"
    (model / "config.json").write_text('{"changed": 1}\n')
    changed = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=model), "cpu-tiny"))
    assert changed["model verified"][0] == "fail" and "config.json" in changed["model verified"][1]


def test_a_missing_model_dir_is_named_as_missing_not_judged(tmp_path: Path) -> None:
    gone = tmp_path / "srv" / "models" / "glm53"
    checks = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=gone), "agent-256k"))
    assert checks["model directory"][0] == "fail"
    assert checks["model directory"][1] == f"--model-dir {gone} does not exist"
    assert checks["model directory"][2] is not None and "glm53 model download" in checks["model directory"][2]
    assert "model index" not in checks and "model verified" not in checks, "no verdict on a checkpoint not there"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    checks = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=a_file), "agent-256k"))
    assert checks["model directory"][1] == f"--model-dir {a_file} is not a directory"
    cli = run_glm53("doctor", "--model-dir", str(gone), "--port", str(free_port()))
    assert cli.code == 1 and "model directory" in cli.stderr and "single-file" not in cli.stdout + cli.stderr


def test_upstream_index_fails_until_install_repairs_it(tmp_path: Path) -> None:
    # A checkpoint laid out like the real EXL3 one, whose index (like upstream's) omits kpool_aux and mtp:
    # verified against its lock, the index check fails with the install fix; after `install` both pass.
    from glm53.checkpoint.index_repair import install
    from glm53.checkpoint.lock import default_lock_path, lock_from_directory, write_lock
    from tests.support.tiny_glm53 import write_tiny_glm53_checkpoint

    model = write_tiny_glm53_checkpoint(tmp_path / "ck")
    write_lock(lock_from_directory(model), default_lock_path(model))
    before = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=model), "agent-256k"))
    assert before["model verified"][0] == "ok"
    assert before["model index"][0] == "fail" and "not in the index" in before["model index"][1]
    assert before["model index"][2] is not None and before["model index"][2].startswith("glm53 model install")
    install(model)
    after = _by_name(_report(_facts("gpu-host", two_3090s(), model_dir=model), "agent-256k"))
    assert after["model index"][0] == "ok"
    assert after["model verified"][0] == "ok" and "index repaired" in after["model verified"][1]


def test_the_gpu_paths_prerequisites_are_warnings_naming_their_fix() -> None:
    """Beyond the driver, the README's GPU paths need Nix (the flake's outputs) and, for the vLLM engine's image,
    a container runtime and CDI: each missing one is a warning with its fix, never a failure, since a serve from
    a Python environment needs none of them."""
    from glm53.preflight.doctor import check_gpu_path
    from glm53.preflight.models import ContainerFacts, GpuPathFacts

    bare = GpuPathFacts(nix=None, containers=ContainerFacts(runtimes=[], cdi_specs=[]))
    found = {f.name: f for f in check_gpu_path(bare, image=True)}
    assert set(found) == {"nix", "container runtime", "nvidia cdi"}
    assert all(f.status == "warn" and f.fix for f in found.values())
    assert "nix-command flakes" in (found["nix"].fix or "") and "nvidia-ctk cdi generate" in (
        found["nvidia cdi"].fix or ""
    )
    assert [f.name for f in check_gpu_path(bare, image=False)] == ["nix"]  # ExLlamaV3 runs as a process
    ready = GpuPathFacts(
        nix="/usr/bin/nix", containers=ContainerFacts(runtimes=["podman"], cdi_specs=["/etc/cdi/nvidia.yaml"])
    )
    assert all(f.status == "ok" for f in check_gpu_path(ready, image=True))
    # read from the host and checked for a GPU profile; the CPU profile asks nothing of them
    facts = _facts("gpu-host", two_3090s()).model_copy(update={"gpu_path": bare})
    report = run_checks(facts, requirements_for(load_profile("agent-256k", environ={})), load_limits())
    assert {"nix", "container runtime", "nvidia cdi"} <= {c.name for c in report.checks}
    tiny = run_checks(facts, requirements_for(load_profile("cpu-tiny", environ={})), load_limits())
    assert "nix" not in {c.name for c in tiny.checks}
