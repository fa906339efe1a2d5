"""flake.nix's outputs evaluated against tests/fixtures/nix/stand-in-nixpkgs.nix (nixpkgs' own lib, the flake's
overlay, a plain derivation for every builder and package), whose `nix-instantiate` writes the derivation graph
the real build would have: what each output is built from, and what its scripts and images say."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.nixenv import NIX_ENV
from tests.support.nixeval import NIXPKGS_LIB, ROOT

STAND_IN = ROOT / "tests" / "fixtures" / "nix" / "stand-in-nixpkgs.nix"
SYSTEM = "x86_64-linux"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=NIX_ENV, capture_output=True, text=True, timeout=300)


def stand_in_nixpkgs(folder: Path) -> Path:
    """A folder a flake can `import` as its nixpkgs input: the stand-in with nixpkgs' lib."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "default.nix").write_text(f"import {STAND_IN} {{ lib = import {Path(NIXPKGS_LIB).resolve()}/lib; }}\n")
    return folder


def flake(nixpkgs: Path) -> str:
    """flake.nix's outputs with the stand-in as its nixpkgs input."""
    return (
        f"(let flake = import {ROOT}/flake.nix; nixpkgs = {{ lib = import {Path(NIXPKGS_LIB).resolve()}/lib; "
        f"outPath = {nixpkgs}; }}; self = flake.outputs {{ inherit self nixpkgs; }}; in self)"
    )


def overlaid(nixpkgs: Path, lock: Path, *, cuda: bool = False) -> str:
    """The stand-in nixpkgs with the flake's overlay over a given lock (pins filled in a copy)."""
    config = "config.cudaSupport = true; " if cuda else ""
    return (
        f'(import {nixpkgs} {{ system = "{SYSTEM}"; {config}overlays = [ (import {ROOT}/nix/overlay.nix '
        f"{{ glmLib = import {ROOT}/nix/lib.nix {{ lockFile = {lock}; }}; }}) ]; }})"
    )


def instantiate(expr: str) -> str:
    done = run(["nix-instantiate", "--expr", expr])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def evaluate(expr: str) -> Any:
    done = run(["nix", "eval", "--json", "--impure", "--expr", expr])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def closure(drv: str) -> list[str]:
    """The names (store hash dropped) of everything the derivation is built from, itself included."""
    done = run(["nix-store", "--query", "--requisites", drv])
    assert done.returncode == 0, done.stderr
    return sorted(path.split("-", 1)[1] for path in done.stdout.split())


def derivations(drv: str) -> dict[str, Any]:
    """`nix show-derivation --recursive`: every derivation of the closure, by store path."""
    done = run(["nix", "show-derivation", "--recursive", drv])
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def named(graph: dict[str, Any], name: str) -> Any:
    (found,) = [entry for path, entry in graph.items() if path.split("-", 1)[1] == f"{name}.drv"]
    return found


def output_path(graph: dict[str, Any], name: str) -> str:
    path: str = named(graph, name)["outputs"]["out"]["path"]
    return path


def filled_lock(folder: Path, **changes: Any) -> Path:
    """A copy of the lock in `folder` with the vLLM engine's pins filled (made-up commits and hashes), and
    `changes` by dotted field name."""
    lock = json.loads((ROOT / "repro.lock.json").read_text())
    pins = [
        lock["engine"]["vllm"],
        lock["engine"]["glm53_overlay"],
        *lock["engine"]["vllm_cmake_sources"]["sources"].values(),
    ]
    for number, pin in enumerate(pins):
        pin.update(rev=f"{number:x}" * 40, hash="sha256-" + "A" * 43 + "=")
    lock["engine"]["vllm"]["image"]["hash"] = "sha256-" + "B" * 43 + "="
    for path, value in changes.items():
        node = lock
        *parents, last = path.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "repro.lock.json"
    path.write_text(json.dumps(lock))
    return path


__all__ = [
    "STAND_IN",
    "SYSTEM",
    "closure",
    "derivations",
    "evaluate",
    "filled_lock",
    "flake",
    "instantiate",
    "named",
    "output_path",
    "overlaid",
    "run",
    "stand_in_nixpkgs",
]
