"""nix/router.nix evaluated by nixpkgs' own lib (`lib.evalModules`), as tests/test_nix_module.py evaluates
nix/module.nix: the rendered unit (the same hardening source), the API key as a credential, the fleet file,
and the build-time check (`glm53 router --dry-run` on the rendered fleet) built for real.

The check runs the unit's own package: here a Python environment with glm53 and the real vllm-router (the
glm53-router package), or one with glm53 alone (the CLI, as packages.glm53 is): the router's flags are
checked by the vllm-router that package holds, never by whatever this development environment has.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.nixeval import ROOT, ROUTER, needs_nixpkgs_lib, prefixes
from tests.support.systemd_parse import parse_exec

pytestmark = needs_nixpkgs_lib

CONFIG = 'enable = true; backends = [ "http://10.0.0.11:8000" "http://10.0.0.12:8000" ];'


def evaluate(config: str) -> subprocess.CompletedProcess[str]:
    return ROUTER.evaluate(config)


def build_check(config: str) -> subprocess.CompletedProcess[str]:
    return ROUTER.build_check(config)


def test_the_unit_runs_glm53_router_under_the_shared_hardening() -> None:
    result = evaluate(CONFIG)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["failedAssertions"] == [] and data["ports"] == []
    service = data["service"]
    unit = service["serviceConfig"]
    argv = parse_exec(unit["ExecStart"], specifiers={})
    assert argv[:2] == [f"{prefixes()['router']}/bin/glm53", "router"] and argv[3:] == ["--skip-probe"]
    fleet = json.loads(Path(argv[2]).read_text()) if Path(argv[2]).exists() else None
    hardening = json.loads((ROOT / "python/src/glm53/data/systemd-unit.json").read_text())
    tightened = {"DeviceAllow", "SupplementaryGroups", "RestartSec", "TimeoutStartSec"}
    assert {k: unit[k] for k in hardening["service"] if k not in tightened} == {
        k: v for k, v in hardening["service"].items() if k not in tightened
    }
    assert unit["DeviceAllow"] == [] and unit["DevicePolicy"] == "closed" and unit["SupplementaryGroups"] == []
    assert "LoadCredential" not in unit
    # The data file's environment, and the PATH NixOS gives every service (the router needs nothing on it).
    assert {k: v for k, v in service["environment"].items() if k != "PATH"} == hardening["environment"]
    del fleet  # the store path exists only once built (test_the_build_time_check_runs_glm53_router)


def test_the_api_key_is_a_credential_and_listen_all_needs_it() -> None:
    public = CONFIG + ' host = "0.0.0.0"; listenAll = true; openFirewall = true;'
    result = evaluate(public + ' apiKeyFile = "/run/secrets/glm53";')
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    unit = data["service"]["serviceConfig"]
    assert unit["LoadCredential"] == ["api-key:/run/secrets/glm53"]
    argv = parse_exec(unit["ExecStart"], specifiers={"d": "/run/credentials/glm53-router.service"})
    assert argv[-4:] == [
        *("--skip-probe", "--listen-all", "--api-key-file", "/run/credentials/glm53-router.service/api-key")
    ]
    assert data["ports"] == [8100]
    without = evaluate(public)
    assert without.returncode == 0, without.stderr
    assert any("apiKeyFile" in m for m in json.loads(without.stdout)["failedAssertions"])
    literal = evaluate(public + " apiKeyFile = /run/secrets/glm53;")
    assert literal.returncode != 0 and "not in the Nix store" in literal.stderr


def test_an_unknown_policy_fails_evaluation() -> None:
    result = evaluate(CONFIG + ' policy = "fastest";')
    assert result.returncode != 0 and "policy" in result.stderr


def test_the_check_fails_with_a_package_that_has_no_vllm_router() -> None:
    """packages.glm53 (the CLI) has no vllm-router: the router could never start, so the build fails now."""
    cli = f'{{ type = "derivation"; name = "glm53"; outPath = "{prefixes()["cli"]}"; meta.mainProgram = "glm53"; }}'
    built = build_check(CONFIG + f" package = {cli};")
    assert built.returncode != 0
    assert "the router's flags cannot be checked: vllm-router is not installed here" in built.stderr


def test_the_build_time_check_runs_glm53_router() -> None:
    built = build_check(CONFIG + " settings.limits.queue_size = 16;")
    assert built.returncode == 0, built.stderr
    fleet = json.loads(Path(built.stdout.strip()).read_text())
    assert fleet["backends"] == [{"url": "http://10.0.0.11:8000"}, {"url": "http://10.0.0.12:8000"}]
    assert fleet["limits"] == {"queue_size": 16} and fleet["policy"] == "sticky_least_loaded"
    bad = build_check(CONFIG + " settings.limits.queue = 16;")  # a field glm53 does not know
    assert bad.returncode != 0 and "queue" in bad.stderr
    dup = build_check('enable = true; backends = [ "http://10.0.0.11:8000" "http://10.0.0.11:8000/" ];')
    assert dup.returncode != 0 and "listed twice" in dup.stderr
