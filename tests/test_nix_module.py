"""nix/module.nix evaluated by nixpkgs' own lib (`lib.evalModules`) and its build-time settings check built for
real: the rendered unit for the README's configuration, and each way a configuration must fail the build.

nixpkgs is not reachable here; its lib is (about 2 MB): point NIXPKGS_LIB at a checkout of
nix-community/nixpkgs.lib at the pinned branch (a folder with lib/ in it). Without it these tests are skipped.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.nixeval import GLM53_PREFIX, ROOT, SERVER, needs_nixpkgs_lib

pytestmark = needs_nixpkgs_lib

README_CONFIG = 'enable = true; modelDir = "/srv/models/glm53"; settings.MAX_MODEL_LEN = 131072;'


def evaluate(config: str, host: str | None = None) -> subprocess.CompletedProcess[str]:
    return SERVER.evaluate(config, host)


def build_check(config: str) -> subprocess.CompletedProcess[str]:
    return SERVER.build_check(config)


def test_the_readme_configuration_renders_the_unit_exactly() -> None:
    result = evaluate(README_CONFIG)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["failedAssertions"] == [] and data["ports"] == []
    service = data["service"]
    unit = service["serviceConfig"]
    glm53 = f"{GLM53_PREFIX}/bin/glm53"
    argv = shlex.split(unit["ExecStart"])
    env_file = argv[argv.index("--env-file") + 1]
    assert argv == [
        glm53,
        "serve",
        "--profile",
        "agent-256k",
        "--model-dir",
        "/srv/models/glm53",
        "--env-file",
        env_file,
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--skip-preflight",
    ]
    assert shlex.split(unit["ExecStartPre"]) == [
        glm53,
        "doctor",
        "--profile",
        "agent-256k",
        "--model-dir",
        "/srv/models/glm53",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    assert "LoadCredential" not in unit
    assert unit["ReadOnlyPaths"] == ["/srv/models/glm53"]
    # The hardening is the data file's, the same that `glm53 systemd-unit` renders and systemd-analyze scores.
    hardening = json.loads((ROOT / "python/src/glm53/data/systemd-unit.json").read_text())
    assert {key: unit[key] for key in hardening["service"]} == hardening["service"]
    assert unit["LimitMEMLOCK"] == "infinity" and unit["CapabilityBoundingSet"] == ""
    assert service["environment"] == hardening["environment"]
    assert service["startLimitBurst"] == hardening["unit"]["StartLimitBurst"]

    built = build_check(README_CONFIG)
    assert built.returncode == 0, built.stderr
    out = built.stdout.strip()
    assert out == env_file
    assert Path(out).read_text() == "MAX_MODEL_LEN=131072\n"
    sys.stderr.write(f"\n[module] ExecStart={unit['ExecStart']}\n[module] settings check built: {out}\n")


def test_the_api_key_is_a_credential_never_a_store_path() -> None:
    result = evaluate(README_CONFIG + ' host = "0.0.0.0"; listenAll = true; apiKeyFile = "/run/secrets/glm53";')
    assert result.returncode == 0, result.stderr
    unit = json.loads(result.stdout)["service"]["serviceConfig"]
    assert unit["LoadCredential"] == ["api-key:/run/secrets/glm53"]
    argv = shlex.split(unit["ExecStart"])
    assert argv[-6:] == ["--port", "8000", "--listen-all", "--api-key-file", "%d/api-key", "--skip-preflight"]
    # A path literal would be copied into the world-readable store: the option type refuses it.
    literal = evaluate(README_CONFIG + " apiKeyFile = /run/secrets/glm53;")
    assert literal.returncode != 0
    assert "services.glm53.apiKeyFile" in literal.stderr and "not in the Nix store" in literal.stderr
    model_literal = evaluate("enable = true; modelDir = /srv/models/glm53;")
    assert model_literal.returncode != 0 and "services.glm53.modelDir" in model_literal.stderr


def test_the_nvidia_driver_must_be_configured() -> None:
    result = evaluate(README_CONFIG, host="")
    assert result.returncode == 0, result.stderr
    (message,) = json.loads(result.stdout)["failedAssertions"]
    assert 'services.xserver.videoDrivers = [ "nvidia" ]' in message


def test_listening_everywhere_needs_an_api_key() -> None:
    result = evaluate(README_CONFIG + ' host = "0.0.0.0"; listenAll = true;')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["failedAssertions"] == [
        "services.glm53.listenAll opens the server to other machines: set services.glm53.apiKeyFile too."
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("settings.MAX_MODEL_LEM = 1;", "unknown key 'MAX_MODEL_LEM'"),
        ('settings.MAX_MODEL_LEN = "lots";', "MAX_MODEL_LEN='lots' is not an integer"),
        ('host = "0.0.0.0";', "--listen-all"),
        ('host = "localhost";', "--host 'localhost' is not an IP address"),
    ],
    ids=["typo", "unparsable", "open-without-listen-all", "localhost"],
)
def test_a_bad_setting_fails_the_build_with_glm53s_message(config: str, message: str) -> None:
    built = build_check('enable = true; modelDir = "/srv/models/glm53"; ' + config)
    assert built.returncode != 0
    assert message in built.stderr
    if "MAX_MODEL_LEM" in config:
        assert "did you mean MAX_MODEL_LEN" in built.stderr
    # The CLI says the same thing for the same input (one rule, in Python).
    if "host" in config:
        host = config.split('"')[1]
        cli = subprocess.run(
            [str(GLM53_PREFIX / "bin" / "glm53"), "profile", "check", "--host", host],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 2 and message in cli.stderr
