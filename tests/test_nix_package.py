"""The vLLM package (pkgs/vllm-glm53) evaluated with nixpkgs' own lib and stand-ins for what only full nixpkgs
has (vLLM's recipe, torch, fetchFromGitHub): the sources its CMake variables name come from repro.lock.json,
and an unfilled one stops evaluation naming its lock field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.nixenv import NIX_ENV
from tests.support.nixeval import NIXPKGS_LIB, ROOT, needs_nixpkgs_lib

pytestmark = needs_nixpkgs_lib

VLLM_PACKAGE = """
let
  lib = import {nixpkgs_lib}/lib;
  glmLib = import {root}/nix/lib.nix {{ lockFile = {lock}; }};
  recipe = {{
    override = _: recipe;
    overridePythonAttrs = change: change {{ }};
    passthru.cudaPackages.cudaMajorMinorVersion = lib.versions.majorMinor glmLib.pins.cuda.vllm.version;
  }};
in
import {root}/pkgs/vllm-glm53 {{
  inherit lib glmLib;
  vllm = recipe;
  torch = {{
    stdenv.mkDerivation = attrs: "/built/${{attrs.name}}";
    pythonModule.version = "3.12.8";
  }};
  fetchFromGitHub = source: "/fetched/${{source.owner}}/${{source.repo}}/${{source.rev}}";
  exllamav3-glm53 = null;
  nvidia-ml-py = null;
}}
"""


def _vllm_package_env(lock: Path, attribute: str) -> subprocess.CompletedProcess[str]:
    expr = VLLM_PACKAGE.format(nixpkgs_lib=NIXPKGS_LIB, root=ROOT, lock=lock)
    return subprocess.run(
        ["nix", "eval", "--raw", "--impure", "--expr", f"({expr}).env.{attribute}"],
        env=NIX_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_vllm_package_takes_its_cmake_sources_from_the_lock(tmp_path: Path) -> None:
    unset = _vllm_package_env(ROOT / "repro.lock.json", "QUTLASS_SRC_DIR")
    assert unset.returncode != 0
    assert (
        "repro.lock.json: engine.vllm_cmake_sources.sources.qutlass.rev (cmake/external_projects/qutlass.cmake, "
        "GIT_TAG) is not pinned yet" in unset.stderr
    )

    lock = json.loads((ROOT / "repro.lock.json").read_text())
    for number, pin in enumerate(lock["engine"]["vllm_cmake_sources"]["sources"].values()):
        pin.update(rev=f"{number:x}" * 40, hash="sha256-" + "A" * 43 + "=")
    filled = tmp_path / "repro.lock.json"
    filled.write_text(json.dumps(lock))
    qutlass_rev = f"{list(lock['engine']['vllm_cmake_sources']['sources']).index('qutlass'):x}" * 40
    assert _vllm_package_env(filled, "QUTLASS_SRC_DIR").stdout == f"/fetched/IST-DASLab/qutlass/{qutlass_rev}"
    triton = _vllm_package_env(filled, "TRITON_KERNELS_SRC_DIR")
    assert triton.returncode == 0, triton.stderr
    assert triton.stdout.startswith("/fetched/triton-lang/triton/") and triton.stdout.endswith("/triton_kernels")
    assert _vllm_package_env(filled, "FLASH_MLA_SRC_DIR").stdout == "/built/flashmla-with-cutlass"
