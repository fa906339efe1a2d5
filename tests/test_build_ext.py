"""pkgs/exllamav3/build_ext.py chooses a release's own source rules when it ships them (1.6.x's
exllamav3/util/cuda_flags.py) and the copied 1.4.6 rules otherwise. Read without torch: the build imports it
only when it compiles."""

import importlib.util
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEEL_165 = next(iter(sorted((ROOT / ".whl165").glob("exllamav3-1.6.5-*.whl"))), None)


def load_build_ext() -> ModuleType:
    spec = importlib.util.spec_from_file_location("glm53_test_build_ext", ROOT / "pkgs/exllamav3/build_ext.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources_tree(package: Path) -> Path:
    """An extension folder of 1.6.5's shape: CUDA sources, and ROCm-only ones under rocm/."""
    sources = package / "exllamav3_ext"
    (sources / "quant").mkdir(parents=True)
    (sources / "rocm" / "quant").mkdir(parents=True)
    (sources / "bindings.cpp").write_text("")
    (sources / "quant" / "exl3_gemm.cu").write_text("")
    (sources / "rocm" / "quant" / "exl3_gemv_rdna.cu").write_text("")
    return sources


def test_a_release_without_its_own_rules_builds_with_the_copied_ones(tmp_path: Path) -> None:
    build_ext = load_build_ext()
    assert build_ext._release_rules(str(sources_tree(tmp_path / "exllamav3"))) is None
    assert "--use_fast_math" in build_ext.NVCC_FLAGS and build_ext.CXX_FLAGS == ["-Ofast"]


@pytest.mark.skipif(WHEEL_165 is None, reason="ExLlamaV3 1.6.5's wheel is not in .whl165 (tools/exl3-gpu-run.sh)")
def test_1_6_5s_own_rules_leave_its_rocm_sources_out_of_a_cuda_build(tmp_path: Path) -> None:
    assert WHEEL_165 is not None
    package = tmp_path / "exllamav3"
    sources = sources_tree(package)
    (package / "util").mkdir()
    with zipfile.ZipFile(WHEEL_165) as wheel:
        (package / "util" / "cuda_flags.py").write_bytes(wheel.read("exllamav3/util/cuda_flags.py"))
    rules = load_build_ext()._release_rules(str(sources))
    assert rules is not None
    chosen = [Path(path).relative_to(sources).as_posix() for path in rules.extension_sources(str(sources), hip=False)]
    assert chosen == ["bindings.cpp", "quant/exl3_gemm.cu"]
    flags = rules.cuda_cflags(cuda_home=None)
    assert "-O3" in flags and "--use_fast_math" in flags


def test_a_releases_rules_are_loaded_from_its_own_file(tmp_path: Path) -> None:
    package = tmp_path / "exllamav3"
    sources = sources_tree(package)
    (package / "util").mkdir()
    (package / "util" / "cuda_flags.py").write_text(
        "def extension_sources(sources_dir, hip=False):\n    return ['from-the-release']\n"
    )
    rules = load_build_ext()._release_rules(str(sources))
    assert rules is not None and rules.extension_sources(str(sources)) == ["from-the-release"]
    assert Path(rules.__file__) == package / "util" / "cuda_flags.py"
