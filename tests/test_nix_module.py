"""nix/module.nix evaluated by nixpkgs' own lib (`lib.evalModules`) and its build-time settings check built for
real: the vLLM engine as the vendor image's container, the native unit (the exllamav3 engine, vLLM from
source), and each way a configuration must fail the build.

What a NixOS host decides is modelled from nixpkgs' sources in tests/fixtures/nix/eval-module.nix: a service's
default PATH (coreutils, findutils, grep, sed, systemd: nixos/lib/systemd-lib.nix), how the unit file is
written, hardware.nvidia.enabled (nixos/modules/hardware/video/nvidia.nix), oci-containers' service. The
packages are Python environments holding what the real ones hold (tests/support/nixeval.py).

nixpkgs is not reachable here; its lib is (about 2 MB): point NIXPKGS_LIB at a checkout of
nix-community/nixpkgs.lib at the pinned branch (a folder with lib/ in it). Without it these tests are skipped.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.nixeval import ROOT, SERVER, needs_nixpkgs_lib, prefixes
from tests.support.systemd_parse import directives, parse_credential, parse_exec, parse_paths

pytestmark = needs_nixpkgs_lib

README_CONFIG = 'enable = true; modelDir = "/srv/models/glm53"; settings.MAX_MODEL_LEN = 131072;'
NATIVE_VLLM = README_CONFIG + " container = false;"
EXL3 = 'enable = true; engine = "exllamav3"; modelDir = "/srv/models/glm53";'
SPECIFIERS = {"d": "/run/credentials/glm53.service"}
FIELDS = ("failedAssertions", "ports", "service", "unit", "services", "containers", "containerToolkit")


def evaluate(config: str, host: str | None = None) -> dict[str, Any]:
    result = SERVER.evaluate(config, host, fields=FIELDS)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def build_check(config: str) -> subprocess.CompletedProcess[str]:
    return SERVER.build_check(config)


def _exec(unit: dict[str, Any], key: str) -> list[str]:
    value = unit["serviceConfig"][key]
    return parse_exec(value if isinstance(value, str) else value[0], specifiers=SPECIFIERS)


# --- the vLLM engine: the vendor image, run by podman -----------------------------------------------------------


def test_the_readme_configuration_runs_the_vendor_image_with_the_gpus_as_cdi_devices() -> None:
    data = evaluate(README_CONFIG)
    assert data["failedAssertions"] == [] and data["ports"] == []
    assert data["services"] == ["podman-glm53"] and data["service"] is None  # no native unit
    assert data["containerToolkit"] is True  # hardware.nvidia-container-toolkit: the CDI devices
    container = data["containers"]["glm53"]
    assert container["image"] == "glm53:0.1.0" and container["imageFile"].endswith("-docker-image-glm53.tar.gz")
    assert container["devices"] == ["nvidia.com/gpu=all"]
    assert container["ports"] == ["127.0.0.1:8000:8000"]
    settings = container["volumes"][1].split(":")[0]
    assert container["volumes"] == ["/srv/models/glm53:/model:ro", f"{settings}:/etc/glm53/settings.env:ro"]
    assert container["cmd"] == ["--profile", "agent-256k", "--env-file", "/etc/glm53/settings.env", "--port", "8000"]
    # The recipe's docker run flags.
    assert container["extraOptions"] == [
        "--ipc=host",
        "--ulimit=memlock=-1:-1",
        "--ulimit=stack=67108864",
        "--cap-add=SYS_PTRACE",
    ]
    built = build_check(README_CONFIG)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == settings and Path(settings).read_text() == "MAX_MODEL_LEN=131072\n"


def test_the_container_unit_explains_a_missing_checkpoint_before_podman_mounts_it() -> None:
    built = SERVER.build(README_CONFIG, attribute="containerStart")
    assert built.returncode == 0, built.stderr
    missing = subprocess.run(["/bin/sh", built.stdout.strip()], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1
    assert "the checkpoint /srv/models/glm53 (services.glm53.modelDir) is not a directory" in missing.stderr
    assert "glm53 model download/verify/install" in missing.stderr


def test_the_container_service_starts_with_that_check_and_restarts_boundedly() -> None:
    result = SERVER.evaluate(README_CONFIG, fields=("containerUnit",))
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["containerUnit"]
    config = service["serviceConfig"]
    pre = config["ExecStartPre"]
    assert len(pre) == 2 and pre[0].endswith("-glm53-require-model-dir") and pre[1].endswith("-pre-start")
    assert config["Restart"] == "on-failure" and config["RestartSec"] == 90
    assert service["startLimitBurst"] == 3
    run = shlex.split(service["script"].replace("\\\n", " "))
    assert run[:3] == ["exec", "podman", "run"]
    assert "--device=nvidia.com/gpu=all" in run and "/srv/models/glm53:/model:ro" in run
    assert run[run.index("glm53:0.1.0") + 1 :] == [
        *("--profile", "agent-256k", "--env-file", "/etc/glm53/settings.env", "--port", "8000")
    ]


# --- the native unit: the exllamav3 engine, or vLLM from source ---------------------------------------------


@pytest.mark.parametrize(
    ("config", "package", "engine"),
    [(NATIVE_VLLM, "runtime", "vllm"), (EXL3, "exl3", None)],
    ids=["vllm-from-source", "exllamav3"],
)
def test_the_native_unit_finds_its_engine_on_a_nixos_services_path(
    config: str, package: str, engine: str | None
) -> None:
    data = evaluate(config)
    service = data["service"]
    path = service["environment"]["PATH"]
    prefix = prefixes()[package]
    # NixOS gives a service coreutils, findutils, grep, sed and systemd; the package's bin goes first, as
    # `glm53 systemd-unit` puts the installation's bin first.
    assert path.split(":")[0] == f"{prefix}/bin"
    assert [entry.split("-", 1)[1] for entry in path.split(":")[1:6]] == [
        "coreutils-9.8/bin",
        "findutils-4.10.0/bin",
        "gnugrep-3.12/bin",
        "gnused-4.9/bin",
        "systemd-258/bin",
    ]
    if engine is not None:  # glm53 runs `vllm serve` from PATH (os.execvpe): the runtime's own vllm
        assert shutil.which(engine, path=path) == f"{prefix}/bin/{engine}"
    # nixpkgs' CUDA libraries find the driver through their RUNPATH; glm53 points Triton at libcuda from here.
    assert service["environment"]["LD_LIBRARY_PATH"] == "/run/opengl-driver/lib"


def test_the_native_unit_runs_doctor_then_serve_with_the_settings_as_a_credential() -> None:
    data = evaluate(NATIVE_VLLM)
    assert data["failedAssertions"] == [] and data["services"] == ["glm53"] and data["containers"] == {}
    unit = data["service"]
    glm53 = f"{prefixes()['runtime']}/bin/glm53"
    assert _exec(unit, "ExecStart") == [
        glm53,
        *("serve", "--profile", "agent-256k", "--model-dir", "/srv/models/glm53"),
        *("--env-file", "/run/credentials/glm53.service/env-file"),
        *("--host", "127.0.0.1", "--port", "8000", "--skip-preflight"),
    ]
    assert _exec(unit, "ExecStartPre") == [
        glm53,
        *("doctor", "--profile", "agent-256k", "--model-dir", "/srv/models/glm53", "--host", "127.0.0.1"),
        *("--port", "8000"),
    ]
    (credential,) = unit["serviceConfig"]["LoadCredential"]
    name, settings = parse_credential(credential, specifiers=SPECIFIERS)
    assert name == "env-file"
    (paths,) = unit["serviceConfig"]["ReadOnlyPaths"]
    assert parse_paths(paths, specifiers=SPECIFIERS) == [("/srv/models/glm53", True)]
    # The hardening is the data file's, the same that `glm53 systemd-unit` renders and systemd-analyze scores.
    hardening = json.loads((ROOT / "python/src/glm53/data/systemd-unit.json").read_text())
    assert {key: unit["serviceConfig"][key] for key in hardening["service"]} == hardening["service"]
    assert unit["startLimitBurst"] == hardening["unit"]["StartLimitBurst"]
    assert {k: v for k, v in unit["environment"].items() if k in hardening["environment"]} == hardening["environment"]
    built = build_check(NATIVE_VLLM)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == settings and Path(settings).read_text() == "MAX_MODEL_LEN=131072\n"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_verifies_the_native_unit_as_nixos_writes_it(tmp_path: Path) -> None:
    unit = tmp_path / "glm53.service"
    unit.write_text(evaluate(EXL3)["unit"])
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "glm53.service" not in result.stdout + result.stderr, result.stderr


def test_a_missing_checkpoint_is_explained_by_doctor_before_any_mount(tmp_path: Path) -> None:
    """ReadOnlyPaths= is optional, so systemd reaches ExecStartPre, which says what is missing (run here with the
    unit's own argv and environment, as systemd would)."""
    missing = tmp_path / "not downloaded"
    data = evaluate(f'enable = true; engine = "exllamav3"; modelDir = "{missing}";')
    unit = data["service"]
    assert parse_paths(unit["serviceConfig"]["ReadOnlyPaths"][0], specifiers=SPECIFIERS) == [(str(missing), True)]
    doctor = subprocess.run(
        _exec(unit, "ExecStartPre"),
        # The unit's environment (COLUMNS only keeps the report's table from wrapping the line read here).
        env={key: value for key, value in unit["environment"].items() if value is not None} | {"COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert doctor.returncode != 0
    assert f"--model-dir {missing} does not exist" in doctor.stdout
    assert "model directory" in doctor.stderr


def test_the_api_key_is_a_credential_never_a_store_path() -> None:
    public = NATIVE_VLLM + ' host = "0.0.0.0"; listenAll = true; apiKeyFile = "/run/secrets/glm53 50%";'
    unit = evaluate(public)["service"]
    assert unit["serviceConfig"]["LoadCredential"][1] == "api-key:/run/secrets/glm53 50%%"
    assert _exec(unit, "ExecStart")[-6:] == [
        *("--port", "8000", "--listen-all", "--api-key-file", "/run/credentials/glm53.service/api-key"),
        "--skip-preflight",
    ]
    container = evaluate(README_CONFIG + ' apiKeyFile = "/run/secrets/glm53";')["containers"]["glm53"]
    assert container["volumes"][-1] == "/run/secrets/glm53:/run/secrets/glm53-api-key:ro"
    assert container["cmd"][-2:] == ["--api-key-file", "/run/secrets/glm53-api-key"]
    # A path literal would be copied into the world-readable store: the option type refuses it.
    literal = SERVER.evaluate(NATIVE_VLLM + " apiKeyFile = /run/secrets/glm53;")
    assert literal.returncode != 0
    assert "services.glm53.apiKeyFile" in literal.stderr and "not in the Nix store" in literal.stderr
    model_literal = SERVER.evaluate("enable = true; container = false; modelDir = /srv/models/glm53;")
    assert model_literal.returncode != 0 and "services.glm53.modelDir" in model_literal.stderr


# --- the host ------------------------------------------------------------------------------------------------


def test_the_nvidia_driver_must_be_configured() -> None:
    (message,) = evaluate(README_CONFIG, host="")["failedAssertions"]
    assert 'services.xserver.videoDrivers = [ "nvidia" ]' in message
    assert "hardware.nvidia.datacenter.enable" in message


def test_the_datacenter_driver_is_a_driver_too() -> None:
    """nixpkgs' nvidia module installs the driver for the "nvidia" video driver or the datacenter driver
    (hardware.nvidia.enabled covers both); a datacenter host has no video driver at all."""
    assert evaluate(README_CONFIG, host="hardware.nvidia.datacenter.enable = true;")["failedAssertions"] == []
    assert evaluate(EXL3, host="hardware.nvidia.datacenter.enable = true;")["failedAssertions"] == []


def test_listening_everywhere_needs_an_api_key() -> None:
    assert evaluate(README_CONFIG + ' host = "0.0.0.0"; listenAll = true;')["failedAssertions"] == [
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
            [str(prefixes()["cli"] / "bin" / "glm53"), "profile", "check", "--host", host],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 2 and message in cli.stderr


def test_the_unit_files_directives_are_as_nixos_writes_them() -> None:
    text = evaluate(EXL3)["unit"]
    assert directives(text, "ReadOnlyPaths") == ['"-/srv/models/glm53"']
    assert directives(text, "PrivateDevices") == ["false"] and directives(text, "DynamicUser") == ["true"]
