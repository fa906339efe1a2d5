"""nix/router.nix evaluated by nixpkgs' own lib (`lib.evalModules`), as tests/test_nix_module.py evaluates
nix/module.nix: the rendered unit (the same hardening source), the API key as a credential, the fleet file,
and the build-time check (`glm53 router --dry-run` on the rendered fleet) built for real.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.nixenv import NIX_ENV

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "fixtures" / "router" / "eval-router.nix"
NIXPKGS_LIB = os.environ.get("NIXPKGS_LIB", "")
GLM53_PREFIX = Path(sys.executable).parent.parent

pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)"),
    pytest.mark.skipif(
        not (NIXPKGS_LIB and (Path(NIXPKGS_LIB) / "lib" / "default.nix").is_file()),
        reason="NIXPKGS_LIB is unset: point it at a nix-community/nixpkgs.lib checkout to evaluate the module",
    ),
]

CONFIG = 'enable = true; backends = [ "http://10.0.0.11:8000" "http://10.0.0.12:8000" ];'


def _glm53_has_router() -> bool:
    result = subprocess.run([str(GLM53_PREFIX / "bin" / "glm53"), "--help"], capture_output=True, text=True)
    return " router " in result.stdout or "│ router" in result.stdout


def _expr(config: str) -> str:
    return (
        f"import {HARNESS} {{ nixpkgsLib = {Path(NIXPKGS_LIB).resolve()}; "
        f'glm53Prefix = "{GLM53_PREFIX}"; config = {{ {config} }}; }}'
    )


def evaluate(config: str) -> subprocess.CompletedProcess[str]:
    expr = f"let r = {_expr(config)}; in {{ inherit (r) failedAssertions ports service; }}"
    return subprocess.run(
        ["nix", "eval", "--json", "--impure", "--expr", expr],
        cwd=ROOT,
        env=NIX_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def build_check(config: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nix-build", "--no-out-link", "-E", _expr(config), "-A", "check"],
        cwd=ROOT,
        env=NIX_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_unit_runs_glm53_router_under_the_shared_hardening() -> None:
    result = evaluate(CONFIG)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["failedAssertions"] == [] and data["ports"] == []
    service = data["service"]
    unit = service["serviceConfig"]
    argv = shlex.split(unit["ExecStart"])
    assert argv[:2] == [f"{GLM53_PREFIX}/bin/glm53", "router"] and argv[3:] == ["--skip-probe"]
    fleet = json.loads(Path(argv[2]).read_text()) if Path(argv[2]).exists() else None
    hardening = json.loads((ROOT / "python/src/glm53/data/systemd-unit.json").read_text())
    tightened = {"DeviceAllow", "SupplementaryGroups", "RestartSec", "TimeoutStartSec"}
    assert {k: unit[k] for k in hardening["service"] if k not in tightened} == {
        k: v for k, v in hardening["service"].items() if k not in tightened
    }
    assert unit["DeviceAllow"] == [] and unit["DevicePolicy"] == "closed" and unit["SupplementaryGroups"] == []
    assert "LoadCredential" not in unit
    assert service["environment"] == hardening["environment"]
    del fleet  # the store path exists only once built (test_the_build_time_check_runs_glm53_router)


def test_the_api_key_is_a_credential_and_listen_all_needs_it() -> None:
    public = CONFIG + ' host = "0.0.0.0"; listenAll = true; openFirewall = true;'
    result = evaluate(public + ' apiKeyFile = "/run/secrets/glm53";')
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    unit = data["service"]["serviceConfig"]
    assert unit["LoadCredential"] == ["api-key:/run/secrets/glm53"]
    assert shlex.split(unit["ExecStart"])[-4:] == ["--skip-probe", "--listen-all", "--api-key-file", "%d/api-key"]
    assert data["ports"] == [8100]
    without = evaluate(public)
    assert without.returncode == 0, without.stderr
    assert any("apiKeyFile" in m for m in json.loads(without.stdout)["failedAssertions"])
    literal = evaluate(public + " apiKeyFile = /run/secrets/glm53;")
    assert literal.returncode != 0 and "not in the Nix store" in literal.stderr


def test_an_unknown_policy_fails_evaluation() -> None:
    result = evaluate(CONFIG + ' policy = "fastest";')
    assert result.returncode != 0 and "policy" in result.stderr


@pytest.mark.skipif(not _glm53_has_router(), reason="cli/main.py does not register `glm53 router` yet")
def test_the_build_time_check_runs_glm53_router() -> None:
    built = build_check(CONFIG + " settings.limits.queue_size = 16;")
    assert built.returncode == 0, built.stderr
    fleet = json.loads(Path(built.stdout.strip()).read_text())
    assert fleet["backends"] == [{"url": "http://10.0.0.11:8000"}, {"url": "http://10.0.0.12:8000"}]
    assert fleet["limits"] == {"queue_size": 16} and fleet["policy"] == "consistent_hash"
    bad = build_check(CONFIG + " settings.limits.queue = 16;")  # a field glm53 does not know
    assert bad.returncode != 0 and "queue" in bad.stderr
    dup = build_check('enable = true; backends = [ "http://10.0.0.11:8000" "http://10.0.0.11:8000/" ];')
    assert dup.returncode != 0 and "listed twice" in dup.stderr
