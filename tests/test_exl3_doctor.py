"""Doctor for the exllamav3 engine: TabbyAPI's tree, ExLlamaV3's version against the lock, its prebuilt extension
and the GPUs' compute capability, as pure checks over synthetic facts; the facts read from a TabbyAPI tree and an
installed distribution laid out in a temporary folder; and `glm53 doctor` on the command line."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import pytest

from glm53.host.exl3_engine import Exl3EngineFacts, read_exl3_engine
from glm53.host.gpus import read_gpus
from glm53.preflight.doctor import (
    ENGINE_LIBRARIES_CHECK,
    DoctorFacts,
    DoctorReport,
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
PINNED = load_limits().exllamav3_version
READY = Exl3EngineFacts(
    tabby_dir="/opt/tabbyAPI",
    tabby_main=True,
    tabby_python="/opt/tabbyAPI/venv/bin/python",
    exllamav3_version=PINNED,
    extension="/opt/exl3/lib/exllamav3_ext.cpython-311-x86_64-linux-gnu.so",
    fla_version=None,
)
EXL3_CHECKS = ("tabbyapi", "exllamav3", "exllamav3 extension", "compute capability")


def _facts(nvml: FakeNvml, engine: Exl3EngineFacts = READY, tree: str = "gpu-host") -> DoctorFacts:
    facts = read_facts(
        FIXTURES / tree, gpu_reader=lambda: read_gpus(nvml), machine="x86_64", port=free_port(), engine="exllamav3"
    )
    return facts.model_copy(update={"exl3": engine})


def _report(facts: DoctorFacts, profile: str = "exl3-2x3090") -> DoctorReport:
    loaded = load_profile(profile, environ={})
    return run_checks(facts, requirements_for(loaded), load_limits(loaded.engine), profile=profile)


def _by_name(report: DoctorReport) -> dict[str, tuple[str, str, str | None]]:
    return {c.name: (c.status, c.detail, c.fix) for c in report.checks}


def test_the_pinned_version_comes_from_the_lock() -> None:
    from glm53.recipe.pins import load_repro_lock

    assert PINNED == load_repro_lock().engine.exllamav3.version == "1.4.6"


def test_requirements_of_the_exl3_profiles() -> None:
    two = requirements_for(load_profile("exl3-2x3090", environ={}))
    one = requirements_for(load_profile("exl3-1gpu", environ={}))
    assert (two.engine, two.gpus, one.engine, one.gpus) == ("exllamav3", 2, "exllamav3", 1)
    assert requirements_for(load_profile("exl3-1gpu", environ={}, overrides=[("GPUS", "3")])).gpus == 3
    assert requirements_for(load_profile("agent-256k", environ={})).engine == "vllm"


def test_a_ready_recipe_rig_passes_and_vllms_library_check_is_not_this_engines() -> None:
    report = _report(_facts(two_3090s()))
    checks = _by_name(report)
    assert report.ok, [c for c in report.checks if c.status == "fail"]
    assert [name for name in checks if name in EXL3_CHECKS] == list(EXL3_CHECKS)
    assert checks["tabbyapi"][0] == "ok" and "/opt/tabbyAPI" in checks["tabbyapi"][1]
    assert checks["exllamav3"] == ("ok", PINNED, None)
    assert checks["exllamav3 extension"][0] == "ok" and "exllamav3_ext" in checks["exllamav3 extension"][1]
    assert checks["compute capability"] == ("ok", "8.6", None)
    assert ENGINE_LIBRARIES_CHECK not in checks
    # The vLLM profile on the same facts does check vLLM's libraries, and none of the exllamav3 items.
    vllm = _by_name(_report(_facts(two_3090s()), "agent-256k"))
    assert ENGINE_LIBRARIES_CHECK in vllm and not set(EXL3_CHECKS) & set(vllm)


def test_tabbyapi_not_set_or_not_a_tree_fails_with_the_fix() -> None:
    unset = _by_name(_report(_facts(two_3090s(), READY.model_copy(update={"tabby_dir": None, "tabby_main": False}))))
    status, detail, fix = unset["tabbyapi"]
    assert status == "fail" and detail == "$GLM53_TABBYAPI_DIR: not set"
    assert fix is not None and "set GLM53_TABBYAPI_DIR" in fix and "engine.tabbyapi" in fix
    empty = READY.model_copy(update={"tabby_dir": "/srv/empty", "tabby_main": False})
    status, detail, _ = _by_name(_report(_facts(two_3090s(), empty)))["tabbyapi"]
    assert status == "fail" and "/srv/empty has no main.py and common/config_models.py" in detail


@pytest.mark.parametrize(
    ("version", "status", "detail"),
    [
        ("1.4.5", "fail", f"1.4.5, pinned {PINNED}"),
        ("1.5.0", "fail", f"1.5.0, pinned {PINNED}"),
        (None, "fail", "not installed in /opt/tabbyAPI/venv/bin/python"),  # READY names its Python
        (f"{PINNED}+cu128.torch2.9", "ok", f"{PINNED}+cu128.torch2.9"),
    ],
)
def test_exllamav3_must_be_the_pinned_version(version: str | None, status: str, detail: str) -> None:
    report = _report(_facts(two_3090s(), READY.model_copy(update={"exllamav3_version": version})))
    got = _by_name(report)["exllamav3"]
    assert got[:2] == (status, detail)
    assert report.ok is (status == "ok")
    if status == "fail":
        assert got[2] is not None and PINNED in got[2]


def test_without_the_prebuilt_extension_it_would_compile_at_start() -> None:
    report = _report(_facts(two_3090s(), READY.model_copy(update={"extension": None})))
    status, detail, fix = _by_name(report)["exllamav3 extension"]
    assert status == "fail" and "no prebuilt exllamav3_ext" in detail
    assert fix is not None and "build_ext.py" in fix
    assert [c.name for c in report.failures] == ["exllamav3 extension"]


def test_a_turing_gpu_is_too_old_for_exllamav3() -> None:
    nvml = FakeNvml(gpus=[FakeGpu("NVIDIA GeForce RTX 2080 Ti", 24576, 0, capability=(7, 5))])
    checks = _by_name(_report(_facts(nvml), "exl3-1gpu"))
    status, detail, fix = checks["compute capability"]
    assert status == "fail" and "GPU 0 NVIDIA GeForce RTX 2080 Ti (sm_75)" in detail and "8.0 or newer" in detail
    assert fix is not None and "Ampere" in fix
    assert checks["gpu 0"][0] == "fail" and "not sm_75" in checks["gpu 0"][1]


def test_an_h200_passes_the_capability_checks_that_vllms_sm86_build_fails() -> None:
    h200 = FakeNvml(gpus=[FakeGpu("NVIDIA H200", 143771, 0, capability=(9, 0))])
    exl3 = _by_name(_report(_facts(h200), "exl3-1gpu"))
    assert exl3["compute capability"] == ("ok", "9.0", None)
    assert exl3["gpu 0"][0] == "ok" and "sm_90" in exl3["gpu 0"][1]
    # The vLLM engine is built for sm_86 only (repro.lock.json engine.cuda.capabilities).
    vllm = _by_name(run_checks(_facts(h200), requirements_for(load_profile("agent-256k", environ={})), load_limits()))
    assert vllm["gpu 0"][0] == "fail" and "not sm_90" in vllm["gpu 0"][1]


def test_too_few_gpus_names_the_exllamav3_fix_not_a_vllm_key() -> None:
    one = FakeNvml(gpus=[FakeGpu("NVIDIA GeForce RTX 3090", 24576, 0)])
    status, detail, fix = _by_name(_report(_facts(one), "exl3-2x3090"))["gpu count"]
    assert status == "fail" and "needs 2" in detail
    assert fix is not None and "GPUS=1" in fix and "exl3-1gpu" in fix and "TENSOR_PARALLEL_SIZE" not in fix
    # The key it names is one the profile takes.
    assert load_profile("exl3-2x3090", environ={}, overrides=[("GPUS", "1")]).value("GPUS") == "1"


def test_engine_facts_are_read_from_a_tree_and_an_installed_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tabby = tmp_path / "tabbyAPI"
    (tabby / "common").mkdir(parents=True)
    site = tmp_path / "site"
    (site / "exllamav3-1.4.6.dist-info").mkdir(parents=True)
    (site / "exllamav3-1.4.6.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: exllamav3\nVersion: 1.4.6\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "exllamav3_ext", raising=False)

    partial = read_exl3_engine({"GLM53_TABBYAPI_DIR": str(tabby)})
    assert partial.tabby_dir == str(tabby) and partial.tabby_main is False  # main.py and the schema missing
    assert partial.exllamav3_version == "1.4.6" and partial.extension is None

    (tabby / "main.py").write_text("")
    (tabby / "common" / "config_models.py").write_text("")
    # Not a loadable library: found by name only, never imported (importing it would initialise CUDA).
    ext = site / f"exllamav3_ext{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"not an ELF file")
    facts = read_exl3_engine({"GLM53_TABBYAPI_DIR": str(tabby)})
    assert facts.tabby_main is True and facts.tabby_python is None
    assert facts.extension == str(ext) and "exllamav3_ext" not in sys.modules
    # TabbyAPI's own Python (`glm53 repro install-engine`'s venv): asked in its own process, with its own path.
    monkeypatch.undo()
    elsewhere = {"GLM53_TABBYAPI_DIR": str(tabby), "GLM53_TABBYAPI_PYTHON": sys.executable, "PYTHONPATH": str(site)}
    assert read_exl3_engine(elsewhere) == facts.model_copy(update={"tabby_python": sys.executable})
    assert read_exl3_engine({**elsewhere, "PYTHONPATH": str(tmp_path)}).extension is None  # not in that Python
    missing = read_exl3_engine({**elsewhere, "GLM53_TABBYAPI_PYTHON": str(tmp_path / "no-python")})
    assert missing.exllamav3_version is None and missing.tabby_python_error == (
        f"$GLM53_TABBYAPI_PYTHON {tmp_path / 'no-python'} not found"
    )
    failed = _report(_facts(two_3090s(), missing))
    assert any(c.name == "exllamav3" and "no-python not found" in c.detail for c in failed.checks)
    report = _report(_facts(two_3090s(), facts))
    assert report.ok, [c for c in report.checks if c.status == "fail"]

    assert read_exl3_engine({}).tabby_dir is None and read_exl3_engine({}).tabby_main is False


def test_cli_doctor_for_an_exl3_profile_reports_instead_of_crashing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command used to look up vLLM's library check, which an exllamav3 report does not have.
    monkeypatch.setitem(sys.modules, "pynvml", two_3090s())
    monkeypatch.delenv("GLM53_TABBYAPI_DIR", raising=False)
    result = run_glm53(
        "doctor",
        "--profile",
        "exl3-2x3090",
        "--host-root",
        str(FIXTURES / "gpu-host"),
        "--port",
        str(free_port()),
        "--json",
    )
    assert result.code == 1, result.stderr
    checks = {c["name"]: c for c in result.json()["checks"]}
    assert checks["tabbyapi"]["status"] == "fail" and ENGINE_LIBRARIES_CHECK not in checks
    assert checks["compute capability"]["status"] == "ok"
    assert "tabbyapi" in result.stderr


def test_the_expert_cache_needs_its_prebuilt_extension() -> None:
    """EXPERT_CACHE=1 adds a check of glm53_expert_cache; without the key there is no such check."""
    cached = load_profile("exl3-2x3090", environ={}, overrides=[("EXPERT_CACHE", "1"), ("EXPERT_CACHE_WINDOW", "82")])
    need = requirements_for(cached)
    assert need.expert_cache
    facts = _facts(two_3090s())
    missing = run_checks(facts, need, load_limits("exllamav3"))
    status, detail, fix = _by_name(missing)["expert cache extension"]
    assert status == "fail" and "glm53_expert_cache" in detail and fix is not None and "build_ext.py" in fix
    built = facts.model_copy(
        update={"exl3": READY.model_copy(update={"cache_extension": "/opt/exl3/lib/glm53_expert_cache.so"})}
    )
    assert _by_name(run_checks(built, need, load_limits("exllamav3")))["expert cache extension"][0] == "ok"
    assert "expert cache extension" not in _by_name(_report(facts))
