"""The second engine without Nix: the lock's wheels (engine.tabbyapi.environment) and `glm53 repro
install-engine`. The lock is checked against the wheels' own metadata (their Requires-Dist, recorded by
tools/lock-engine-env.py from pip's report), and against the wheel files themselves where a wheelhouse is at
hand; the command is run for real up to what this machine lacks (a torch with CUDA)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from glm53.errors import BadInput, Unavailable
from glm53.recipe.pins import EnvironmentWheel, load_repro_lock
from glm53.repro.engine_env import (
    InstallRequest,
    InterpreterFacts,
    base_pip_is_used,
    check_base,
    copy_tabbyapi,
    install_steps,
    requirements_text,
    wheels_for,
)
from tests.support.cli import run_glm53

ROOT = Path(__file__).resolve().parents[1]
LOCK = load_repro_lock(ROOT / "repro.lock.json")
ENVIRONMENT = LOCK.engine.tabbyapi.environment
assert ENVIRONMENT is not None
LINUX = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix"}
WHEELHOUSE = ROOT / ".whl"  # the cp312 wheels tools/exl3-gpu-run.sh carries to the GPU machine, where present


def _markers(abi: str) -> dict[str, str]:
    version = f"{abi[2]}.{abi[3:]}"
    return {**LINUX, "python_version": version, "python_full_version": f"{version}.0", "extra": ""}


def _applies(requirement: Requirement, abi: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate(_markers(abi))


@pytest.mark.parametrize("abi", sorted(ENVIRONMENT.abis))
def test_every_requirement_of_every_locked_wheel_is_locked_or_the_base(abi: str) -> None:
    wheels = {wheel.name: wheel for wheel in ENVIRONMENT.abis[abi]}  # type: ignore[index]
    base = {canonicalize_name(Requirement(line).name) for line in ENVIRONMENT.base}
    unmet = []
    for wheel in wheels.values():
        for line in wheel.requires:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if not _applies(requirement, abi) or name in base:
                continue
            found = wheels.get(name)
            if found is None or not requirement.specifier.contains(Version(found.version), prereleases=True):
                unmet.append(f"{wheel.name} {wheel.version} needs {line}; locked: {found and found.version}")
    assert unmet == []


@pytest.mark.parametrize("abi", sorted(ENVIRONMENT.abis))
def test_the_roots_are_met_and_each_wheel_fits_its_abi(abi: str) -> None:
    wheels = {wheel.name: wheel for wheel in ENVIRONMENT.abis[abi]}  # type: ignore[index]
    for line in ENVIRONMENT.requirements:
        requirement = Requirement(line)
        found = wheels[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(Version(found.version), prereleases=True), (line, found.version)
    assert wheels["exllamav3"].version == LOCK.engine.exllamav3.version
    assert wheels["exllamav3"].sha256 == LOCK.engine.exllamav3.wheel.sha256  # the same file as the Nix build's
    for name, pin in LOCK.engine.tabbyapi.python.items():
        assert (wheels[name].version, wheels[name].sha256) == (pin.version, pin.sha256)
    for wheel in wheels.values():
        name, version, _, tags = parse_wheel_filename(wheel.url.rsplit("/", 1)[1])
        assert (name, str(version)) == (wheel.name, wheel.version)
        interpreters = {tag.interpreter for tag in tags}
        assert interpreters & {abi, "py3", "cp39", "cp38", "cp37", "cp310"} or any(tag.abi == "abi3" for tag in tags), (
            wheel.url
        )
        assert all(tag.platform == "any" or "x86_64" in tag.platform for tag in tags), wheel.url
    assert not {"torch", "triton"} & set(wheels)  # the base interpreter's, with the host's CUDA


def test_the_constraints_say_why() -> None:
    assert ENVIRONMENT.constraints and all(reason.strip() for reason in ENVIRONMENT.constraints.values())
    assert set(ENVIRONMENT.constraints) <= set(ENVIRONMENT.requirements)


WHEELS = sorted(WHEELHOUSE.glob("*.whl")) if WHEELHOUSE.is_dir() else []


@pytest.mark.skipif(not WHEELS, reason="no wheelhouse (.whl, tools/exl3-gpu-run.sh) here")
@pytest.mark.parametrize("path", WHEELS, ids=lambda path: path.name)
def test_a_wheel_file_is_what_the_lock_says(path: Path) -> None:
    locked = {wheel.url.rsplit("/", 1)[1]: wheel for wheel in ENVIRONMENT.abis["cp312"]}
    wheel = locked.get(path.name)
    if wheel is None:
        pytest.skip(f"{path.name} is not in the cp312 environment (another version in the wheelhouse)")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == wheel.sha256
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    assert (metadata.get_all("Requires-Dist") or []) == wheel.requires


def test_requirements_pin_every_wheel_by_version_and_hash() -> None:
    wheels = [
        EnvironmentWheel(name="uvicorn", version="0.55.0", url="https://files.pythonhosted.org/packages/a/u.whl",
                         sha256="a" * 64),
    ]  # fmt: skip
    assert requirements_text(wheels) == f"uvicorn==0.55.0 --hash=sha256:{'a' * 64}\n"


def _facts(**kwargs: object) -> InterpreterFacts:
    values: dict[str, object] = {"python": "/usr/bin/python3", "abi": "cp311", "version": "3.11.2"}
    values.update(torch="2.9.0+cu128", cuda="12.8", error=None, cuda_home="/usr/local/cuda", nvcc="12.9")
    values.update(kwargs)
    return InterpreterFacts.model_validate(values)


def test_the_base_interpreter_must_bring_torch_with_cuda() -> None:
    check_base(_facts(), ENVIRONMENT)
    with pytest.raises(Unavailable, match="built without CUDA"):
        check_base(_facts(torch="2.13.0+cpu", cuda=None), ENVIRONMENT)
    with pytest.raises(Unavailable, match="no CUDA toolkit") as caught:
        check_base(_facts(nvcc=None, cuda_home=None), ENVIRONMENT)
    assert "CUDA 12 toolkit" in str(caught.value.fix)
    with pytest.raises(Unavailable, match="across major versions"):
        check_base(_facts(nvcc="13.0"), ENVIRONMENT)
    with pytest.raises(Unavailable, match="cannot import torch"):
        check_base(_facts(torch=None, error="ModuleNotFoundError"), ENVIRONMENT)
    with pytest.raises(Unavailable, match="cp311, cp312") as caught:
        wheels_for(ENVIRONMENT, _facts(abi="cp313", version="3.13.1"))
    assert "--python" in str(caught.value.fix)


def test_a_tabbyapi_tree_is_copied_only_at_the_locks_commit_or_hash(tmp_path: Path) -> None:
    tree = tmp_path / "tabby"
    tree.mkdir()
    (tree / "main.py").write_text("print('tabby')\n")
    with pytest.raises(BadInput, match="NAR hash") as caught:
        copy_tabbyapi(tree, tmp_path / "copy", LOCK)
    assert "git archive" in str(caught.value.fix)
    assert not (tmp_path / "copy").exists()
    if shutil.which("git") is None:
        return
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(tree), *argv], check=True)
    with pytest.raises(BadInput, match="checked out at") as caught:
        copy_tabbyapi(tree, tmp_path / "copy", LOCK)
    assert f"checkout {LOCK.engine.tabbyapi.rev}" in str(caught.value.fix)
    with pytest.raises(BadInput, match=r"no main\.py"):
        copy_tabbyapi(tmp_path, tmp_path / "copy", LOCK)


def test_install_engine_refuses_an_existing_directory_and_leaves_it(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    result = run_glm53("repro", "install-engine", str(target), "--python", sys.executable, "--cuda-arch", "8.6")
    assert result.code == 2 and f"{target} exists" in result.stderr, result.stderr
    assert [p.name for p in target.iterdir()] == ["mine.txt"] and (target / "mine.txt").read_text() == "keep"


def test_install_engine_on_a_python_whose_torch_has_no_cuda_is_exit_3_and_writes_nothing(tmp_path: Path) -> None:
    # This machine's torch is the CPU build vLLM's CPU wheel brings: the real interpreter, really probed.
    target = tmp_path / "engine"
    result = run_glm53("repro", "install-engine", str(target), "--python", sys.executable, "--cuda-arch", "8.6")
    assert result.code == 3, result.stderr
    assert "without CUDA" in result.stderr and "download.pytorch.org/whl/cu" in result.stderr
    assert list(tmp_path.iterdir()) == []  # neither DIR nor DIR.partial


def test_install_engine_names_a_bad_architecture(tmp_path: Path) -> None:
    result = run_glm53(
        "repro", "install-engine", str(tmp_path / "e"), "--python", sys.executable, "--cuda-arch", "sm86"
    )
    assert result.code == 2 and "--cuda-arch sm86" in result.stderr, result.stderr


def test_install_engine_dry_run_lists_its_steps(tmp_path: Path) -> None:
    tabby = ROOT / "tests" / "fixtures" / "tabbyapi"
    result = run_glm53(
        "repro", "install-engine", str(tmp_path / "e"), "--python", sys.executable, "--cuda-arch", "8.6",
        "--tabbyapi", str(tabby), "--dry-run", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["base"]["abi"] == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    steps = plan["steps"]
    assert [step["name"] for step in steps] == [
        "environment",
        "wheels",
        "base",
        "tabbyapi",
        "exllamav3_ext",
        "glm53_expert_cache",
        "imports",
    ]
    assert "--require-hashes" in steps[1]["argv"] and "--no-deps" in steps[1]["argv"]
    assert "--system-site-packages" not in steps[0]["argv"]  # a .pth names the base's site packages instead
    assert steps[2]["argv"] is None and steps[3]["argv"] is None  # written, copied and checked by glm53
    assert not (tmp_path / "e").exists()


def _tiny_wheel(folder: Path) -> Path:
    """A real, minimal wheel (what pip checks: METADATA, WHEEL, RECORD), for pip to install by sha256."""
    path = folder / "glm53_probe_pkg-0.1-py3-none-any.whl"
    files = {
        "glm53_probe_pkg/__init__.py": "VALUE = 7\n",
        "glm53_probe_pkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: glm53-probe-pkg\nVersion: 0.1\n",
        "glm53_probe_pkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in files.items():
            archive.writestr(name, body)
        archive.writestr("glm53_probe_pkg-0.1.dist-info/RECORD", "".join(f"{name},,\n" for name in files) + "x,,\n")
    return path


def test_a_base_without_ensurepip_fills_its_venv_with_its_own_pip(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv: `-m venv` cannot bootstrap pip, so the venv is made without it
    and the base's pip installs into it (`pip --python`). The two steps' argv are run for real here."""
    pip_version = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    if len(pip_version) < 2 or Version(pip_version[1]) < Version("22.3"):
        pytest.skip("this interpreter's pip cannot --python")
    facts = _facts(python=sys.executable, ensurepip=False, pip=pip_version[1])
    request = InstallRequest(target=tmp_path / "e", python=sys.executable, cuda_arch=["8.6"], wheels=tmp_path)
    environment, wheels = install_steps(request, facts, LOCK)[:2]
    assert environment.argv is not None and "--without-pip" in environment.argv
    assert wheels.argv is not None and wheels.argv[:5] == [sys.executable, "-m", "pip", "--python", wheels.argv[4]]
    wheel = _tiny_wheel(tmp_path)
    partial = tmp_path / "e.partial"
    partial.mkdir()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (partial / "requirements.txt").write_text(f"glm53-probe-pkg==0.1 --hash=sha256:{digest}\n")
    for step in (environment, wheels):
        assert step.argv is not None
        done = subprocess.run(step.argv, capture_output=True, text=True, check=False, env={**os.environ})
        assert done.returncode == 0, done.stderr
    venv_python = partial / "venv" / "bin" / "python"
    imported = subprocess.run([venv_python, "-c", "import glm53_probe_pkg, sys; print(glm53_probe_pkg.VALUE)"],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert imported.stdout.strip() == "7", imported.stderr
    assert not (partial / "venv" / "bin" / "pip").exists()  # the venv has no pip of its own


def test_a_base_without_ensurepip_or_a_recent_pip_is_refused_with_the_package_to_install() -> None:
    assert base_pip_is_used(_facts(ensurepip=True, pip=None)) is False
    for pip, reason in ((None, "no pip of its own"), ("22.0.2", "predates --python")):
        with pytest.raises(Unavailable, match=reason) as caught:
            base_pip_is_used(_facts(ensurepip=False, pip=pip))
        assert "apt-get install python3-venv" in str(caught.value.fix)
