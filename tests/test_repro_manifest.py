"""Host manifests: `glm53 repro manifest`, `glm53 repro diff`, and the one embedded in bench's summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.host.gpus import read_gpus
from glm53.repro.manifest import MANIFEST_SCHEMA, build_manifest, diff_manifests, load_manifest
from tests.support.cli import run_glm53
from tests.support.fake_nvml import two_3090s

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "repro.lock.json"
# Written by `glm53 repro manifest --profile agent-256k` on an H200 host (1 GPU, driver 580, torch 2.11+cu130).
H200 = ROOT / "tests/fixtures/repro/h200-manifest.json"


def test_manifest_records_the_host_through_the_host_facts_reader(tmp_path: Path) -> None:
    manifest = build_manifest(
        lock_path=LOCK, profile="agent-256k", environ={}, gpu_reader=lambda: read_gpus(two_3090s())
    )
    assert manifest.schema_version == MANIFEST_SCHEMA
    assert [g.name for g in manifest.host.gpus] == ["NVIDIA GeForce RTX 3090"] * 2
    assert manifest.host.driver == "580.95.05" and manifest.host.gpus[0].compute_capability == "8.6"
    assert manifest.repro_lock.sha256 is not None and len(manifest.repro_lock.sha256) == 64
    assert manifest.profile is not None and manifest.profile.values["MAX_MODEL_LEN"].value == "262144"
    assert manifest.profile.values["MAX_MODEL_LEN"].origin == "profile"
    assert manifest.exllamav3_ext.prebuilt in (True, False)
    assert "torch" in manifest.packages and "vllm" in manifest.packages


def test_manifest_cli_writes_atomically_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    first = run_glm53("repro", "manifest", "--out", str(out), "--lock", str(LOCK))
    assert first.code == 0, first.stderr
    assert json.loads(out.read_text())["schema_version"] == MANIFEST_SCHEMA
    again = run_glm53("repro", "manifest", "--out", str(out), "--lock", str(LOCK))
    assert again.code == 2 and "--force" in again.stderr


def test_the_gpu_fixture_against_the_lock_names_the_pinned_differences() -> None:
    result = run_glm53("repro", "diff", str(H200), "--lock", str(LOCK), "--json")
    assert result.code == 1
    facts = {d["fact"]: d for d in result.json()["differences"]}
    assert facts["GPUs"]["b"] == "2x NVIDIA GeForce RTX 3090" and "H200" in facts["GPUs"]["a"]
    assert facts["compute capability"]["a"] == "9.0"
    # torch 2.11+cu130 there: the CUDA of the recipe's engine (the vendor image's 13.0.1), compared as 13.0.
    assert "CUDA runtime" not in facts
    assert all(d["group"] == "pinned" for d in result.json()["differences"][:3])
    assert "NVIDIA driver" not in facts  # 580.159 meets the lock's 580


def test_two_manifests_diff_grouped_pinned_first(tmp_path: Path) -> None:
    h200 = load_manifest(H200)
    same = run_glm53("repro", "diff", str(H200), str(H200))
    assert same.code == 0 and "no differences" in same.stdout
    other = h200.model_copy(deep=True)
    other.hostname = "elsewhere"
    other.host.kernel_release = "6.1.0"
    other.packages["torch"] = "2.10.0"
    diff = diff_manifests(h200, other)
    assert [d.group for d in diff.differences] == ["pinned", "performance", "informational"]
    assert diff.differences[0].fact == "package torch" and diff.pinned_differ
    path = tmp_path / "other.json"
    path.write_text(other.model_dump_json())
    assert run_glm53("repro", "diff", str(H200), str(path)).code == 1
    other.packages["torch"] = h200.packages["torch"]
    path.write_text(other.model_dump_json())
    assert run_glm53("repro", "diff", str(H200), str(path)).code == 0


@pytest.mark.parametrize("text", ['{"schema_version": "glm53.repro-manifest/9"}', "[]", "{"])
def test_a_bad_manifest_is_bad_input(tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(text)
    assert run_glm53("repro", "diff", str(path), str(H200)).code == 2


def test_bench_summary_embeds_the_manifest() -> None:
    from glm53.bench.report import Summary, collect_environment

    environment = collect_environment(None, environ={})
    assert environment.manifest is not None and environment.manifest.schema_version == MANIFEST_SCHEMA
    dumped = Summary(environment=environment).model_dump(mode="json")
    assert dumped["environment"]["manifest"]["host"]["machine"]
    assert Summary.model_validate(dumped).environment.manifest == environment.manifest
