"""The second engine (TabbyAPI + ExLlamaV3) at the lock's pins without Nix: `glm53 repro install-engine DIR`.

    interpreter_facts(python) -> InterpreterFacts   its ABI, and its torch with CUDA (the base of the environment)
    requirements_text(wheels) -> str               pip's hash-checking requirements, one wheel a line
    install_steps(request, facts) -> [InstallStep]  what an install runs, in order (printed by --dry-run)
    install_engine(request) -> EngineInstallResult  runs them; DIR appears only when every step passed

DIR holds `venv/` (which reads the base interpreter's site packages after its own, for its torch), the wheels of
`engine.tabbyapi.environment.abis[ABI]` installed with `--require-hashes --no-deps` (from PyPI, or from
`--wheels DIR` offline), `tabbyapi/` at `engine.tabbyapi.rev` (cloned, or copied from `--tabbyapi TREE` after
its commit or NAR hash is checked), and ExLlamaV3's extension and glm53's expert cache built ahead for the
GPUs' CUDA architectures with pkgs/exllamav3/build_ext.py (never compiled at serve time). Everything is
written to DIR.partial and renamed to DIR at the end: a failed install leaves no DIR.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from glm53.errors import BadInput, Unavailable
from glm53.host.source_tree import checkout_commit
from glm53.proc import run, text
from glm53.recipe.pins import EngineEnvironment, EnvironmentWheel, ReproLock
from glm53.repro.nar import nar_hash_path

# What the base interpreter reports about itself: `python -c PROBE`.
PROBE = """
import json, sys, sysconfig
paths = sysconfig.get_paths()
facts = {"abi": f"cp{sys.version_info[0]}{sys.version_info[1]}", "version": sys.version.split()[0],
         "torch": None, "cuda": None, "error": None,
         "site_packages": sorted({paths["purelib"], paths["platlib"]})}
import importlib.util
facts["ensurepip"] = importlib.util.find_spec("ensurepip") is not None
try:
    import pip
    facts["pip"] = pip.__version__
except Exception:
    facts["pip"] = None
try:
    import torch
    facts["torch"], facts["cuda"] = torch.__version__, torch.version.cuda
    import re, subprocess
    from torch.utils.cpp_extension import CUDA_HOME
    facts["cuda_home"] = CUDA_HOME
    if CUDA_HOME:
        out = subprocess.run([CUDA_HOME + "/bin/nvcc", "--version"], capture_output=True, text=True).stdout
        found = re.search(r"release ([0-9]+[.][0-9]+)", out)
        facts["nvcc"] = found.group(1) if found else None
except Exception as exc:
    facts["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(facts))
"""
PROBE_TIMEOUT_S = 120.0
SOURCE_ROOT = Path(__file__).resolve().parents[4]  # python/src/glm53/repro/engine_env.py -> the checkout
BUILD_EXT = SOURCE_ROOT / "pkgs" / "exllamav3" / "build_ext.py"
EXPERT_CACHE_SOURCES = SOURCE_ROOT / "pkgs" / "exllamav3" / "expert-cache"
BASE_PTH = "glm53-base-interpreter.pth"
# glm53's own source, for what runs inside TabbyAPI's process (the GPU expert cache, the routing recorder).
SOURCE_PTH = "glm53-source.pth"
# What TabbyAPI's entry point, ExLlamaV3 and glm53's runner import first, checked in the new environment at the end.
IMPORT_CHECK = (
    "exllamav3",
    "exllamav3_ext",
    "glm53_expert_cache",
    "uvicorn",
    "fastapi",
    "loguru",
    "uvloop",
    "glm53.serve.engines.exllamav3.expert_cache",
)


class InterpreterFacts(BaseModel):
    python: str
    abi: str
    version: str
    torch: str | None
    cuda: str | None
    error: str | None
    # Where its torch is installed: the new environment reads them after its own (a .pth file), which
    # --system-site-packages would not do when the base is itself a venv (it names the venv's own base).
    site_packages: list[str] = []
    # The CUDA toolkit torch's extension build uses (CUDA_HOME) and its nvcc's release.
    cuda_home: str | None = None
    nvcc: str | None = None
    # How the venv gets its packages: its own pip (ensurepip, Debian's python3-venv), or else the base's pip
    # aimed at it (`pip --python`, pip >= 22.3).
    ensurepip: bool = True
    pip: str | None = None


class InstallRequest(BaseModel):
    target: Path
    python: str
    cuda_arch: list[str]
    wheels: Path | None = None
    tabbyapi: Path | None = None
    max_jobs: int | None = None


class InstallStep(BaseModel):
    name: str
    argv: list[str] | None  # None: done by glm53 itself (a copy, a check)
    detail: str


class InstallPlan(BaseModel):
    """What --dry-run shows: the base interpreter and the steps an install would run."""

    base: InterpreterFacts
    steps: list[InstallStep]


class EngineInstallResult(BaseModel):
    target: Path
    abi: str
    wheels: int
    tabbyapi_rev: str
    cuda_arch: list[str]
    seconds: dict[str, float]
    next: list[str]


def environment_of(lock: ReproLock) -> EngineEnvironment:
    environment = lock.engine.tabbyapi.environment
    if environment is None:
        raise BadInput(
            "the lock has no engine.tabbyapi.environment (the engine's wheels without Nix)",
            fix="python3 tools/lock-engine-env.py --tabbyapi TABBYAPI_TREE",
        )
    return environment


def wheels_for(environment: EngineEnvironment, facts: InterpreterFacts) -> list[EnvironmentWheel]:
    """The wheels of this interpreter's ABI; Unavailable when the lock has none for it."""
    wheels = environment.abis.get(facts.abi)  # type: ignore[call-overload]
    if wheels is None:
        raise Unavailable(
            f"{facts.python} is CPython {facts.version} ({facts.abi}); the lock has the engine's wheels for "
            f"{', '.join(environment.abis)}",
            fix="pass --python with one of those versions (Debian 12's python3 is cp311)",
        )
    return list(wheels)


def check_base(facts: InterpreterFacts, environment: EngineEnvironment) -> None:
    """The base interpreter brings torch with CUDA (the host's build of it); Unavailable otherwise."""
    base = ", ".join(environment.base)
    fix = (
        f"install torch with CUDA into {facts.python} first ({base}; e.g. `{facts.python} -m pip install torch "
        "--index-url https://download.pytorch.org/whl/cu128`), or pass --python with one that has it"
    )
    if facts.torch is None:
        raise Unavailable(f"{facts.python} cannot import torch ({facts.error})", fix=fix)
    if facts.cuda is None:
        raise Unavailable(f"{facts.python}'s torch {facts.torch} is built without CUDA", fix=fix)
    toolkit = f"the CUDA {facts.cuda.split('.')[0]} toolkit (nvcc)"
    if facts.nvcc is None:
        raise Unavailable(
            f"no CUDA toolkit for the extensions' build: torch finds no nvcc (CUDA_HOME={facts.cuda_home})",
            fix=f"install {toolkit} and set CUDA_HOME to it",
        )
    if facts.nvcc.split(".")[0] != facts.cuda.split(".")[0]:
        raise Unavailable(
            f"nvcc in {facts.cuda_home} is CUDA {facts.nvcc}, {facts.python}'s torch is built for CUDA {facts.cuda}: "
            "torch refuses to build extensions across major versions",
            fix=f"set CUDA_HOME to {toolkit}, or use a torch built for CUDA {facts.nvcc}",
        )


PIP_PYTHON_OPTION = (22, 3)  # the first pip with --python


def base_pip_is_used(facts: InterpreterFacts) -> bool:
    """Whether the venv is made without pip and filled by the base's pip (no ensurepip in the base); Unavailable
    when the base has neither."""
    if facts.ensurepip:
        return False
    version = tuple(int(part) for part in re.findall(r"[0-9]+", facts.pip or "")[:2])
    if facts.pip is None or version < PIP_PYTHON_OPTION:
        raise Unavailable(
            f"{facts.python} has no ensurepip (a venv gets no pip) and "
            + (f"its pip {facts.pip} predates --python (22.3)" if facts.pip else "no pip of its own"),
            fix="on Debian/Ubuntu `apt-get install python3-venv` (or python3.X-venv for that version)",
        )
    return True


def requirements_text(wheels: list[EnvironmentWheel]) -> str:
    """pip's hash-checking mode: every wheel pinned by version and sha256, nothing resolved at install."""
    return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels)


def install_steps(request: InstallRequest, facts: InterpreterFacts, lock: ReproLock) -> list[InstallStep]:
    partial = partial_dir(request.target)
    python = str(partial / "venv" / "bin" / "python")
    site = str(site_packages_of(partial / "venv", facts))
    base_pip = base_pip_is_used(facts)
    pip = [request.python, "-m", "pip", "--python", python] if base_pip else [python, "-m", "pip"]
    pip += ["install", "--no-deps", "--require-hashes", "--only-binary=:all:", "--ignore-installed"]
    pip += ["--no-index", "--find-links", str(request.wheels)] if request.wheels else []
    tabby = lock.engine.tabbyapi
    arch = ";".join(request.cuda_arch)
    steps = [
        InstallStep(
            name="environment",
            argv=[request.python, "-m", "venv", *(["--without-pip"] if base_pip else []), str(partial / "venv")],
            detail=f"a venv of {request.python}'s Python" + (f", filled by its pip {facts.pip}" if base_pip else ""),
        ),
        InstallStep(
            name="wheels",
            argv=[*pip, "-r", str(partial / "requirements.txt")],
            detail=f"every wheel of engine.tabbyapi.environment.abis.{facts.abi}, by sha256",
        ),
        InstallStep(
            name="base",
            argv=None,
            detail=f"{request.python}'s site packages after the venv's own ({BASE_PTH}): its torch {facts.torch}, "
            f"CUDA {facts.cuda}; glm53's source ({SOURCE_PTH}) for its runners inside TabbyAPI",
        ),
        InstallStep(
            name="tabbyapi",
            argv=None
            if request.tabbyapi is not None
            else ["git", "clone", "--quiet", tabby.url, str(partial / "tabbyapi")],
            detail=f"TabbyAPI at {tabby.rev}"
            + (f", copied from {request.tabbyapi}" if request.tabbyapi is not None else ""),
        ),
        InstallStep(
            name="exllamav3_ext",
            argv=[python, str(BUILD_EXT), f"{site}/exllamav3/exllamav3_ext", site],
            detail=f"ExLlamaV3's extension for TORCH_CUDA_ARCH_LIST={arch}",
        ),
        InstallStep(
            name="glm53_expert_cache",
            argv=[python, str(BUILD_EXT), str(EXPERT_CACHE_SOURCES), site],
            detail=f"glm53's GPU expert cache for TORCH_CUDA_ARCH_LIST={arch}",
        ),
        InstallStep(
            name="imports",
            argv=[python, "-c", f"import {', '.join(IMPORT_CHECK)}"],
            detail="what TabbyAPI and ExLlamaV3 import first, in the new environment",
        ),
    ]
    return steps


def failure_log(target: Path, step: str) -> Path:
    return target.with_name(f"{target.name}.{step}-failed.log")


def site_packages_of(venv: Path, facts: InterpreterFacts) -> Path:
    return venv / "lib" / f"python{facts.version.rsplit('.', 1)[0]}" / "site-packages"


def partial_dir(target: Path) -> Path:
    return target.with_name(target.name + ".partial")


def check_target(target: Path) -> None:
    """DIR must not exist yet (an install never writes into a folder it did not make)."""
    if target.exists() or target.is_symlink():
        raise BadInput(f"{target} exists", fix="name a new directory (an install never writes into an existing one)")
    if not target.parent.is_dir():
        raise BadInput(f"{target.parent} is not a directory", fix="create the parent directory first")
    if not os.access(target.parent, os.W_OK):
        raise BadInput(f"{target.parent} is not writable by this user", fix="name a directory you can write")


def next_steps(target: Path) -> list[str]:
    return [
        f"export GLM53_TABBYAPI_DIR={target}/tabbyapi GLM53_TABBYAPI_PYTHON={target}/venv/bin/python",
        "glm53 doctor --profile exl3-1gpu --model-dir MODEL_DIR",
        "glm53 serve --profile exl3-1gpu --model-dir MODEL_DIR",
    ]


def copy_tabbyapi(source: Path, destination: Path, lock: ReproLock) -> None:
    """A TabbyAPI tree given by the user: a checkout at the lock's commit, or an export with the lock's NAR
    hash. Copied without its .git."""
    tabby = lock.engine.tabbyapi
    if not (source / "main.py").is_file():
        raise BadInput(f"--tabbyapi {source} has no main.py", fix="name TabbyAPI's source tree")
    commit = checkout_commit(source)
    if commit is not None and commit != tabby.rev:
        raise BadInput(
            f"--tabbyapi {source} is checked out at {commit}, the lock pins {tabby.rev}",
            fix=f"git -C {source} checkout {tabby.rev}",
        )
    if commit is None:
        found = nar_hash_path(source)
        if found != tabby.hash:
            raise BadInput(
                f"--tabbyapi {source} is not a git checkout and its NAR hash is {found}, the lock's {tabby.hash}",
                fix=f"export TabbyAPI at {tabby.rev} unchanged (git archive), or pass a checkout",
            )
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns(".git"), symlinks=True)


def _run_step(step: InstallStep, env: dict[str, str], cwd: Path, log: Path) -> None:
    """Run one step; on failure its whole output is kept in `log` (beside DIR, which is never made) and its
    error lines are shown."""
    assert step.argv is not None
    done = run(step.argv, env=env, what=f"install step {step.name}", cwd=cwd)
    if done.returncode == 0:
        return
    output = (done.stdout or b"") + (done.stderr or b"")
    log.write_bytes(output)
    lines = output.decode("utf-8", errors="replace").splitlines()
    errors = [line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)][:8] or lines[-12:]
    shown = "\n  ".join(line[:300] for line in errors)
    raise Unavailable(
        f"install step {step.name} failed (exit {done.returncode}):\n  {shown}",
        fix=f"the step's whole output is in {log}",
    )


CUDA_ARCH = re.compile(r"^[0-9]+\.[0-9]+(\+PTX)?$")


def check_request(request: InstallRequest) -> None:
    for arch in request.cuda_arch:
        if not CUDA_ARCH.match(arch):
            raise BadInput(f"--cuda-arch {arch} is not a compute capability", fix="e.g. --cuda-arch 8.6 (RTX 3090)")
    if request.wheels is not None and not request.wheels.is_dir():
        raise BadInput(f"--wheels {request.wheels} is not a directory", fix="name the folder holding the wheels")
    if request.tabbyapi is not None and not request.tabbyapi.is_dir():
        raise BadInput(f"--tabbyapi {request.tabbyapi} is not a directory", fix="name TabbyAPI's source tree")
    if not BUILD_EXT.is_file():
        raise Unavailable(
            f"{BUILD_EXT} not found: the extensions are built from the glm53 checkout's pkgs/",
            fix="run this glm53 from its source checkout (make setup), or use the Nix flake",
        )


def install_engine(
    request: InstallRequest,
    facts: InterpreterFacts,
    lock: ReproLock,
    say: Callable[[str], None],
) -> EngineInstallResult:
    check_request(request)
    check_target(request.target)
    environment = environment_of(lock)
    wheels = wheels_for(environment, facts)
    check_base(facts, environment)
    base_pip_is_used(facts)  # refused before anything is written
    partial = partial_dir(request.target)
    if partial.exists():
        shutil.rmtree(partial)  # our own leftover from an install that was stopped
    partial.mkdir()
    (partial / "requirements.txt").write_text(requirements_text(wheels))
    # The new environment is built and checked as it will run: no PYTHONPATH or pip settings of this shell.
    ignored = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") and key not in ignored}
    env.update(TORCH_CUDA_ARCH_LIST=";".join(request.cuda_arch), PYTHONNOUSERSITE="1")
    if request.max_jobs is not None:
        env["MAX_JOBS"] = str(request.max_jobs)
    seconds: dict[str, float] = {}
    tabby = lock.engine.tabbyapi
    assert tabby.rev is not None
    try:
        for step in install_steps(request, facts, lock):
            started = time.monotonic()
            build = partial / "build" / step.name
            build.mkdir(parents=True, exist_ok=True)
            if step.name == "base":
                site = site_packages_of(partial / "venv", facts)
                (site / BASE_PTH).write_text("".join(f"{path}\n" for path in facts.site_packages))
                (site / SOURCE_PTH).write_text(f"{SOURCE_ROOT / 'python' / 'src'}\n")
            elif step.name == "tabbyapi" and request.tabbyapi is not None:
                copy_tabbyapi(request.tabbyapi, partial / "tabbyapi", lock)
            else:
                if step.name == "glm53_expert_cache":
                    env["EXL3_EXTENSION_NAME"] = "glm53_expert_cache"
                _run_step(step, env, build, failure_log(request.target, step.name))
                env.pop("EXL3_EXTENSION_NAME", None)
                if step.name == "tabbyapi":
                    _run_step(
                        InstallStep(
                            name="tabbyapi",
                            argv=["git", "-C", str(partial / "tabbyapi"), "checkout", "--quiet", tabby.rev],
                            detail="",
                        ),
                        env,
                        build,
                        failure_log(request.target, step.name),
                    )
            seconds[step.name] = round(time.monotonic() - started, 1)
            say(f"{step.name}: {step.detail} ({seconds[step.name]} s)")
        shutil.rmtree(partial / "build", ignore_errors=True)
        (partial / "install.json").write_text(
            json.dumps({"abi": facts.abi, "tabbyapi": tabby.rev, "cuda_arch": request.cuda_arch}, indent=1) + "\n"
        )
        os.replace(partial, request.target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return EngineInstallResult(
        target=request.target,
        abi=facts.abi,
        wheels=len(wheels),
        tabbyapi_rev=tabby.rev,
        cuda_arch=request.cuda_arch,
        seconds=seconds,
        next=next_steps(request.target),
    )


def interpreter_facts(python: str) -> InterpreterFacts:
    fix = "name a CPython 3.11 or 3.12 whose torch has CUDA"
    found = python if os.sep in python else shutil.which(python)
    if found is None or not os.path.isfile(found):
        raise Unavailable(f"--python {python} not found", fix=fix)
    done = run(
        [found, "-c", PROBE],
        env=dict(os.environ),
        what="reading the base interpreter",
        timeout=PROBE_TIMEOUT_S,
        missing_fix=fix,
    )
    if done.returncode != 0:
        raise Unavailable(f"{found} did not run: {text(done.stderr)[-300:]}")
    raw = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return InterpreterFacts(python=found, **raw)


def gpu_architectures(nvidia_smi: str | None = None) -> list[str]:
    """This host's GPUs' compute capabilities (nvidia-smi), e.g. ["8.6"]; Unavailable without a GPU."""
    program = nvidia_smi or shutil.which("nvidia-smi")
    fix = "pass --cuda-arch (e.g. 8.6 for RTX 3090, 9.0 for H100/H200) to build for GPUs this host lacks"
    if program is None:
        raise Unavailable("no nvidia-smi: the GPUs' architectures cannot be read", fix=fix)
    done = run([program, "--query-gpu=compute_cap", "--format=csv,noheader"], env=dict(os.environ), what="nvidia-smi")
    found = sorted({line.strip() for line in text(done.stdout).splitlines() if line.strip()})
    if done.returncode != 0 or not found:
        raise Unavailable(f"nvidia-smi lists no GPU ({text(done.stderr)[-200:]})", fix=fix)
    return found


__all__ = [
    "EngineInstallResult",
    "InstallPlan",
    "InstallRequest",
    "InstallStep",
    "InterpreterFacts",
    "base_pip_is_used",
    "check_base",
    "check_request",
    "check_target",
    "environment_of",
    "gpu_architectures",
    "install_engine",
    "install_steps",
    "interpreter_facts",
    "requirements_text",
    "wheels_for",
]
