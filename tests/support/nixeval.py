"""Evaluate one of our NixOS modules with nixpkgs' own lib (tests/fixtures/nix/eval-module.nix) and build its
build-time check, from the tests. nixpkgs' lib comes from NIXPKGS_LIB (a nix-community/nixpkgs.lib checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.nixenv import NIX_ENV

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "fixtures" / "nix" / "eval-module.nix"
NIXPKGS_LIB = os.environ.get("NIXPKGS_LIB", "")
GLM53_PREFIX = Path(sys.executable).parent.parent  # the venv: its bin/glm53 is the real CLI

needs_nixpkgs_lib = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)"),
    pytest.mark.skipif(
        not (NIXPKGS_LIB and (Path(NIXPKGS_LIB) / "lib" / "default.nix").is_file()),
        reason="NIXPKGS_LIB is unset: point it at a nix-community/nixpkgs.lib checkout to evaluate the module",
    ),
]


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
            f'glm53Prefix = "{GLM53_PREFIX}"; module = {ROOT / self.module}; optionPath = [ {path} ]; '
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

    def build_check(self, config: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nix-build", "--no-out-link", "-E", self.expr(config), "-A", "check"],
            cwd=ROOT,
            env=NIX_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )


SERVER = ModuleHarness("nix/module.nix", ("services", "glm53"), "glm53", "settingsFile")
ROUTER = ModuleHarness("nix/router.nix", ("services", "glm53", "router"), "glm53-router", "fleetFile")

__all__ = ["GLM53_PREFIX", "ROOT", "ROUTER", "SERVER", "ModuleHarness", "needs_nixpkgs_lib"]
