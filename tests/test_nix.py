"""The pure Nix layer, evaluated by the real Nix: pins as Python reads them, settings rendering,
refusal of unset pins, and the bit-for-bit build audit on real derivations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm53.recipe.pins import load_repro_lock
from tests.support.nixenv import NIX_CONFIG, NIX_ENV

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "nix"

pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (.ci/run installs nix-bin)"),
]


def nix_eval(expr: str, *, raw: bool = False) -> subprocess.CompletedProcess[str]:
    mode = "--raw" if raw else "--json"
    return subprocess.run(
        ["nix", "eval", mode, "--impure", "--expr", expr],
        cwd=ROOT,
        env=NIX_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lib_expr(body: str) -> str:
    return f"let lib = import {ROOT}/nix/lib.nix {{}}; in {body}"


def test_every_nix_file_parses() -> None:
    files = sorted([ROOT / "flake.nix", *ROOT.glob("nix/**/*.nix"), *ROOT.glob("pkgs/**/*.nix")])
    assert len(files) >= 9
    for path in files:
        result = subprocess.run(["nix-instantiate", "--parse", str(path)], capture_output=True, text=True, env=NIX_ENV)
        assert result.returncode == 0, f"{path}: {result.stderr}"


def test_nix_reads_the_same_pins_as_python() -> None:
    lock = load_repro_lock(ROOT / "repro.lock.json")
    result = nix_eval(lib_expr("lib.pins"))
    assert result.returncode == 0, result.stderr
    pins = json.loads(result.stdout)
    assert pins["exllamav3"]["rev"] == lock.engine.exllamav3.rev == "499890c75d20d8e7c9d061f37189ae611a5c9f0b"
    assert pins["exllamav3"]["wheel"]["hash"] == lock.engine.exllamav3.wheel.hash
    assert pins["nixpkgs"]["rev"] == lock.nix.nixpkgs.rev
    assert pins["checkpoint"]["revision"] == lock.checkpoint.revision
    assert pins["cuda"]["vllm"]["capabilities"] == lock.engine.cuda.vllm.capabilities
    assert pins["cuda"]["exllamav3"] == lock.engine.cuda.exllamav3.model_dump()
    assert pins["router"]["python"]["vllm-router"]["sha256"] == lock.router.python["vllm-router"].sha256


def test_nix_and_python_default_to_the_same_address() -> None:
    from glm53.constants import DEFAULT_HOST, DEFAULT_PORT

    result = nix_eval(lib_expr("{ host = lib.defaultHost; port = lib.lock.runtime.port; version = lib.version; }"))
    assert result.returncode == 0, result.stderr
    from glm53 import __version__

    assert json.loads(result.stdout) == {"host": DEFAULT_HOST, "port": DEFAULT_PORT, "version": __version__}


def test_flake_lock_matches_repro_lock() -> None:
    lock = load_repro_lock(ROOT / "repro.lock.json")
    flake_lock = json.loads((ROOT / "flake.lock").read_text())
    locked = flake_lock["nodes"]["nixpkgs"]["locked"]
    assert (locked["rev"], locked["narHash"], locked["lastModified"]) == (
        lock.nix.nixpkgs.rev,
        lock.nix.nixpkgs.narHash,
        lock.nix.nixpkgs.lastModified,
    )


def test_settings_render_to_sorted_env_lines() -> None:
    expr = lib_expr(
        "lib.renderEnvFile { MAX_MODEL_LEN = 131072; PREFIX_CACHING = true; "
        'GPU_MEMORY_UTILIZATION = 0.94; SERVED_MODEL_NAME = "GLM-5.3-Flash"; }'
    )
    result = nix_eval(expr, raw=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "GPU_MEMORY_UTILIZATION=0.94\nMAX_MODEL_LEN=131072\nPREFIX_CACHING=1\nSERVED_MODEL_NAME=GLM-5.3-Flash\n"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("{ max_model_len = 1; }", "invalid key(s) max_model_len"),
        ('{ CHAT_TEMPLATE = "a\\nb"; }', "CHAT_TEMPLATE must not contain a newline"),
        ("{ MAX_MODEL_LEN = [ 1 ]; }", "MAX_MODEL_LEN must be a string, number or boolean"),
    ],
)
def test_bad_settings_fail_evaluation_with_the_key(settings: str, message: str) -> None:
    result = nix_eval(lib_expr(f"lib.renderEnvFile {settings}"), raw=True)
    assert result.returncode != 0
    assert message in result.stderr


def test_unset_pin_stops_evaluation_naming_the_lock_field() -> None:
    result = nix_eval(lib_expr('lib.requirePin "engine.vllm.rev" lib.pins.vllm.rev'), raw=True)
    assert result.returncode != 0
    assert "repro.lock.json: engine.vllm.rev is not pinned yet" in result.stderr


def test_serve_args_keep_loopback_unless_told() -> None:
    local = json.loads(
        nix_eval(lib_expr('lib.serveArgs { profile = "agent-256k"; modelDir = "/srv/m"; envFile = "/e"; }')).stdout
    )
    assert local == [
        "serve",
        "--profile",
        "agent-256k",
        "--model-dir",
        "/srv/m",
        "--env-file",
        "/e",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    remote = json.loads(
        nix_eval(
            lib_expr(
                'lib.serveArgs { profile = "agent-256k"; modelDir = "/m"; envFile = "/e"; host = "0.0.0.0"; '
                'listenAll = true; apiKeyFile = "/run/credentials/glm53.service/api-key"; }'
            )
        ).stdout
    )
    assert remote[-3:] == ["--listen-all", "--api-key-file", "/run/credentials/glm53.service/api-key"]
    # Nix passes the address through; it never adds --listen-all on its own.
    bare = json.loads(
        nix_eval(
            lib_expr('lib.serveArgs { profile = "agent-256k"; modelDir = "/m"; envFile = "/e"; host = "0.0.0.0"; }')
        ).stdout
    )
    assert "--listen-all" not in bare


def test_the_module_offers_exactly_the_packaged_profiles() -> None:
    from glm53.recipe.profiles import PROFILE_NAMES

    assert json.loads(nix_eval(lib_expr("lib.profileNames")).stdout) == sorted(PROFILE_NAMES)


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ('host = "127.0.0.1";', 0),
        ('host = "::1";', 0),
        ('host = "localhost";', 2),  # not an IP address: glm53 refuses it, so the build does too
        ('host = "0.0.0.0";', 2),
        ('host = "0.0.0.0"; listenAll = true;', 0),
    ],
)
def test_the_build_time_check_decides_the_address_as_serve_does(tmp_path: Path, address: str, code: int) -> None:
    env_file = tmp_path / "glm53.env"
    env_file.write_text(nix_eval(lib_expr("lib.renderEnvFile { MAX_MODEL_LEN = 131072; }"), raw=True).stdout)
    argv = json.loads(
        nix_eval(lib_expr(f'lib.checkArgs {{ profile = "agent-256k"; envFile = "{env_file}"; {address} }}')).stdout
    )
    result = run_glm53(*argv)
    assert result.returncode == code, result.stderr
    if code:
        assert "--host" in result.stderr


# The glm53 of the interpreter running the tests, not the caller's $VIRTUAL_ENV (a shell's activated venv, which
# need not be this checkout's).
GLM53_EXE = Path(sys.executable).parent / "glm53"


def run_glm53(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GLM53_EXE), *args], cwd=ROOT, env=NIX_ENV, capture_output=True, text=True, timeout=300)


def test_audit_build_passes_a_deterministic_derivation(tmp_path: Path) -> None:
    salt = tmp_path.name  # a fresh derivation each run, so the first build really builds
    result = run_glm53(
        "repro",
        "audit-build",
        "--json",
        "--file",
        str(FIXTURES / "deterministic.nix"),
        "--nix-arg=--argstr",
        "--nix-arg=salt",
        f"--nix-arg={salt}",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["reproducible"] is True
    (out_path,) = report["out_paths"]
    assert Path(out_path).read_text() == f"{salt}\n"
    assert report["nar_hashes"][out_path].startswith("sha256")


def test_audit_build_flags_a_nondeterministic_derivation(tmp_path: Path) -> None:
    result = run_glm53(
        "repro",
        "audit-build",
        "--json",
        "--file",
        str(FIXTURES / "nondeterministic.nix"),
        "--nix-arg=--argstr",
        "--nix-arg=salt",
        f"--nix-arg={tmp_path.name}",
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["reproducible"] is False
    assert "differs" in report["detail"]
    assert "not bit-for-bit reproducible" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the build-users group is only looked up for root")
def test_audit_build_explains_a_missing_build_users_group(tmp_path: Path) -> None:
    env = {**NIX_ENV, "NIX_CONFIG": NIX_CONFIG + "\nbuild-users-group = glm53-no-such-group"}
    result = subprocess.run(
        [
            str(GLM53_EXE),
            "repro",
            "audit-build",
            "--file",
            str(FIXTURES / "deterministic.nix"),
            "--nix-arg=--argstr",
            "--nix-arg=salt",
            f"--nix-arg={tmp_path.name}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 3, result.stderr
    first, fix = result.stderr.strip().splitlines()[:2]
    assert first == "error: nix cannot build: its build-users-group 'glm53-no-such-group' does not exist on this host"
    assert "NIX_CONFIG='build-users-group ='" in fix


def test_rendered_settings_are_what_glm53_reads(tmp_path: Path) -> None:
    """The module's pipeline: Nix renders the settings, `glm53 profile check` validates them."""
    rendered = nix_eval(
        lib_expr("lib.renderEnvFile { MAX_MODEL_LEN = 131072; PREFIX_CACHING = false; GPU_MEMORY_UTILIZATION = 0.9; }"),
        raw=True,
    )
    env_file = tmp_path / "glm53.env"
    env_file.write_text(rendered.stdout)
    result = run_glm53("profile", "check", "--profile", "agent-256k", "--env-file", str(env_file), "--json")
    assert result.returncode == 0, result.stderr
    settings = {row["key"]: row for row in json.loads(result.stdout)["settings"]}
    assert settings["MAX_MODEL_LEN"]["value"] == "131072"
    assert settings["MAX_MODEL_LEN"]["source"] == f"{env_file}:2"
    assert settings["GPU_MEMORY_UTILIZATION"]["value"] == "0.9"
    assert settings["PREFIX_CACHING"]["value"] == "0"

    typo = tmp_path / "typo.env"
    typo.write_text(nix_eval(lib_expr("lib.renderEnvFile { MAX_MODEL_LEM = 1; }"), raw=True).stdout)
    result = run_glm53("profile", "check", "--profile", "agent-256k", "--env-file", str(typo))
    assert result.returncode == 2
    assert "unknown key 'MAX_MODEL_LEM'" in result.stderr and "MAX_MODEL_LEN" in result.stderr
