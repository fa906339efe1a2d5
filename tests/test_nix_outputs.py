"""Outputs built from unpinned sources: Nix lists the same unpinned fields as Python, and their stand-ins
evaluate (so `nix flake check` works) but fail to build, naming the lock fields to fill."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from glm53.recipe.pins import load_repro_lock
from tests.support.nixenv import NIX_ENV

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)"),
]
LIB = f"import {ROOT}/nix/lib.nix {{}}"


def test_nix_and_python_agree_on_what_is_unpinned() -> None:
    result = subprocess.run(
        ["nix", "eval", "--json", "--impure", "--expr", f"({LIB}).unpinned"],
        env=NIX_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == load_repro_lock(ROOT / "repro.lock.json").unpinned()


def test_an_unpinned_output_evaluates_and_its_build_names_the_fields() -> None:
    expr = f'({LIB}).unpinnedStub {{ name = "glm53-runtime"; system = builtins.currentSystem; }}'
    built = subprocess.run(
        ["nix-build", "--no-out-link", "-E", expr], env=NIX_ENV, capture_output=True, text=True, timeout=120
    )
    assert built.returncode != 0
    assert "repro.lock.json: engine.vllm.rev, engine.vllm.hash" in built.stderr
    assert "glm53 repro show lists them" in built.stderr
