"""`glm53 plan host`, `plan simulate`, `plan trace synth` and `probe` through the CLI entry point, in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import run_with_capsys as run

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
RIG = ["--gpu-memory", "24GiB,24GiB", "--host-root", str(HOSTS / "threadripper-5975wx-cgv2")]


def test_plan_env_lines_for_the_recipe_rig(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(["plan", "host", *RIG, "--env"], capsys, monkeypatch)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "CPU_OFFLOAD_GB=54"
    assert "KV_CACHE_MEMORY_BYTES=3328599040" in lines
    assert "HYBRID_MAIN_CPUS=0-33,40-41,48-49,56-57" in lines
    assert "EXL3_HYBRID_CPU='2-7,18-23;10-15,26-31'" in lines  # quoted for the shell
    assert "OMP_NUM_THREADS=12" in lines


def test_plan_json_and_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(["plan", "host", *RIG, "--json"], capsys, monkeypatch)
    assert code == 0
    plan = json.loads(out)
    assert (plan["format"], plan["version"]) == ("glm53-plan", 1)
    assert plan["gpus"][0]["expert_slots"] == 3106  # 3,114 less 8 slots of staging (one step's misses)
    code, out, _ = run(["plan", "host", *RIG], capsys, monkeypatch)
    assert code == 0
    for title in ("GPU memory ledger", "KV cache derivation", "Host memory ledger", "CPU sets", "264,160"):
        assert title in out


def test_plan_out_writes_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, _ = run(["plan", "host", *RIG, "--out", str(tmp_path / "plan"), "--json"], capsys, monkeypatch)
    assert code == 0
    assert json.loads((tmp_path / "plan/plan.json").read_text())["host"]["cpu_offload_gb"] == 54
    assert "CPU_OFFLOAD_GB=54\n" in (tmp_path / "plan/plan.env").read_text()


def test_infeasible_plan_exits_1_with_the_fix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(
        ["plan", "host", "--gpu-memory", "24GiB,24GiB", "--host-root", str(HOSTS / "desktop-8core-cgv1")],
        capsys,
        monkeypatch,
    )
    assert code == 1
    assert "infeasible: host memory" in err
    assert "GiB of RAM" in err


def test_bad_size_flag_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(["plan", "host", "--gpu-memory", "24 bananas"], capsys, monkeypatch)
    assert code == 2
    assert "--gpu-memory" in err


def test_bandwidth_file_feeds_the_cost_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    code, _, _ = run(
        ["plan", "trace", "synth", "--out", str(trace), "--steps", "300", "--seed", "1"], capsys, monkeypatch
    )
    assert code == 0
    probe = Path(__file__).parent / "fixtures" / "plan" / "probe-h200.json"
    code, out, _ = run(
        [
            "plan",
            "host",
            *RIG,
            "--stats",
            str(trace),
            "--bandwidth",
            str(probe),
            "--out",
            str(tmp_path / "p"),
            "--json",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["cost"]["host_to_device"]["bytes_per_s"] == pytest.approx(52_754_271_861.5, rel=1e-9)
    assert plan["cache"]["strategy"] == "trace"
    assert plan["predicted_tokens_per_s"] > 0
    rankings = json.loads((tmp_path / "p" / "hot-rankings.json").read_text())
    assert sorted(rankings["44"]) == list(range(288))
    assert plan["rankings_file"] == str((tmp_path / "p" / "hot-rankings.json").resolve())


def test_simulate_small_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    code, _, _ = run(
        [
            "plan",
            "trace",
            "synth",
            "--out",
            str(trace),
            "--steps",
            "400",
            "--layers",
            "3-6",
            "--experts",
            "32",
            "--top-k",
            "4",
            "--counts",
            str(tmp_path / "c.json"),
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0 and (tmp_path / "c.json").exists()
    code, out, _ = run(
        [
            "plan",
            "simulate",
            str(trace),
            "--budgets",
            "0.25,0.5",
            "--json",
            "--out",
            str(tmp_path / "report.json"),
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0
    report = json.loads(out)
    assert [b["slots"] for b in report["budgets"]] == [32, 64]
    for budget in report["budgets"]:
        rates = {r["policy"]: r["hit_rate"] for r in budget["results"]}
        assert rates["d"] >= rates["c"] - 1e-12
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_synth_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.jsonl").write_text("keep")
    code, _, err = run(["plan", "trace", "synth", "--out", str(tmp_path / "t.jsonl")], capsys, monkeypatch)
    assert code == 2 and "--force" in err
    assert (tmp_path / "t.jsonl").read_text() == "keep"


def test_probe_without_cuda_exits_3(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code, _, err = run(["probe"], capsys, monkeypatch)
    assert code == 3
    assert "no CUDA device" in err


def test_plan_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, glm53.cli.plan, glm53.cli.probe; "
        "heavy = [m for m in ('numpy', 'torch', 'matplotlib') if m in sys.modules]; print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_profile_then_flags(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(
        [
            "plan",
            "host",
            *RIG,
            "--profile",
            "agent-256k",
            "--max-model-len",
            "131072",
            "--kv-cache-memory",
            "derive",
            "--json",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["shape"]["max_model_len"] == 131072
    assert plan["shape"]["gpu_memory_utilization"] == 0.94  # from the profile
    assert plan["kv"]["kv_cache_memory_bytes"] == 131072 * 12_716 + 36_904_960
    assert plan["kv"]["tokens"] == 131072
    assert plan["warnings"] == []


def test_simulate_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.jsonl"
    run(
        [
            "plan",
            "trace",
            "synth",
            "--out",
            str(trace),
            "--steps",
            "200",
            "--layers",
            "3-5",
            "--experts",
            "16",
            "--top-k",
            "2",
        ],
        capsys,
        monkeypatch,
    )
    code, out, _ = run(
        ["plan", "simulate", str(trace), "--budgets", "0.25", "--plots-dir", str(tmp_path / "plots")],
        capsys,
        monkeypatch,
    )
    assert code == 0
    assert "(c) planned" in out
    for name in ("miss-ratio-curves.png", "policies.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_model_dir_is_named_before_anything_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "srv" / "models" / "glm53"
    # Before the GPU question too: on a machine without GPUs the missing directory is what to fix first.
    code, _, err = run(["plan", "host", "--model-dir", str(gone)], capsys, monkeypatch)
    assert code == 2 and f"--model-dir {gone} does not exist" in err
    assert "without --model-dir the plan uses the published model facts" in err
    code, _, err = run(["plan", "host", *RIG, "--model-dir", str(gone)], capsys, monkeypatch)
    assert code == 2 and "does not exist" in err
