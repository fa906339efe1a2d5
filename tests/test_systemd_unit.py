"""`glm53 systemd-unit`: the unit rendered from data/systemd-unit.json, checked by systemd itself.

`systemd-analyze verify` must accept the unit (the ExecStart binary must exist, so the real glm53 is used) and
`systemd-analyze security --offline=yes` must rate it 2.0 or lower; both are skipped where systemd-analyze is
missing (Debian: `apt-get install --no-install-recommends systemd`). The rest is the renderer itself: quoting,
the API-key credential, the loopback rule (through resolve_launch, as `glm53 serve` applies it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from glm53.errors import BadInput, Glm53Error
from glm53.serve import systemd
from glm53.serve.systemd import UnitSettings, load_unit_data, render_unit
from tests.support.systemd_parse import expand_specifiers, extract_words, parse_exec, parse_paths

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: apt-get install --no-install-recommends systemd)",
)
MAX_EXPOSURE = 2.0
# A checkpoint directory the unit names; it need not exist to render or verify the unit.
MODEL_DIR = "/srv/models/glm53-flash"


def _glm53_exe() -> Path:
    """The real glm53 of this environment when the service could see it, else a program that exists."""
    candidate = Path(sys.executable).parent / "glm53"
    found = candidate if candidate.is_file() else Path(shutil.which("glm53") or "/bin/true")
    return found if systemd._hidden_by(found.resolve()) is None else Path("/bin/true")


class Result:
    def __init__(self, code: int, stdout: str, stderr: str, error: Glm53Error | None) -> None:
        self.code, self.stdout, self.stderr, self.error = code, stdout, stderr, error


def run_unit_cli(*args: str) -> Result:
    """`glm53 systemd-unit ARGS` through the command's own register(), errors as glm53.cli.main maps them."""
    from glm53.cli.systemd import register

    app = typer.Typer()
    register(app)

    @app.command("unused")
    def _unused() -> None:  # a second command keeps `systemd-unit` a subcommand
        pass

    result = CliRunner().invoke(app, ["systemd-unit", *args])
    error = result.exception if isinstance(result.exception, Glm53Error) else None
    if result.exception is not None and error is None and not isinstance(result.exception, SystemExit):
        raise result.exception
    code = error.exit_code if error is not None else result.exit_code
    return Result(code, result.stdout, result.stderr, error)


def _settings(**changes: Any) -> UnitSettings:
    base: dict[str, Any] = {
        "profile": "agent-256k",
        "model_dir": Path(MODEL_DIR),
        "host": "127.0.0.1",
        "port": 8000,
        "glm53": Path("/opt/glm53/bin/glm53"),
        "bin_dir": Path("/opt/glm53/bin"),
    }
    return UnitSettings(**(base | changes))


def _directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


SPECIFIERS = {"d": "/run/credentials/glm53.service"}


def _words(command: str) -> list[str]:
    """An ExecStart= value back to argv, as systemd reads it (tests/support/systemd_parse.py)."""
    return parse_exec(command, specifiers=SPECIFIERS)


def _environment(text: str) -> dict[str, str]:
    words = [word for line in _directives(text, "Environment") for word in extract_words(line, cunescape=True)]
    return dict(expand_specifiers(word, SPECIFIERS).split("=", 1) for word in words)


# --- the data file --------------------------------------------------------------------------------------------


def test_the_data_file_is_plain_json_the_nixos_module_can_read() -> None:
    raw = json.loads(resources.files("glm53").joinpath("data/systemd-unit.json").read_text(encoding="utf-8"))
    assert set(raw) == {"about", "unit", "service", "environment", "install", "unset", "why"}
    for section in ("unit", "service", "install"):
        for key, value in raw[section].items():
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", key)
            assert isinstance(value, str | int | bool) or (
                isinstance(value, list) and all(isinstance(item, str) for item in value)
            ), (section, key, value)
    assert all(isinstance(value, str) for value in raw["environment"].values())
    data = load_unit_data()
    service = data.service
    # The gaps closed against nixpkgs' ollama module, and the module's own choices kept.
    expected = {
        "Type": "exec",
        "CapabilityBoundingSet": "",
        "ProtectKernelLogs": True,
        "ProtectHostname": True,
        "ProtectProc": "invisible",
        "ProcSubset": "all",
        "SystemCallErrorNumber": "EPERM",
        "LimitMEMLOCK": "infinity",
        "DevicePolicy": "closed",
        "DynamicUser": True,
        "ProtectSystem": "strict",
        "ProtectHome": True,
        "PrivateDevices": False,
    }
    assert {key: service[key] for key in expected} == expected
    assert service["SystemCallFilter"] == ["@system-service", "@resources", "~@privileged"]
    assert {"AF_UNIX", "AF_NETLINK"} <= set(service["RestrictAddressFamilies"])  # type: ignore[arg-type]
    assert {"char-nvidiactl", "char-nvidia-uvm"} <= set(service["DeviceAllow"])  # type: ignore[arg-type]
    assert {"MemoryDenyWriteExecute", "ProtectClock", "IPAddressDeny"} <= set(data.unset)
    # Every loosening has its why, and ProtectHome says what to do about /home.
    assert set(data.loosenings()) >= {"PrivateDevices", "MemoryDenyWriteExecute", "ProtectClock", "IPAddressDeny"}
    assert all(reason.strip() for reason in data.loosenings().values())
    assert "/home" in data.why["ProtectHome"]


def test_a_loosening_without_its_why_is_refused() -> None:
    raw = json.loads(resources.files("glm53").joinpath("data/systemd-unit.json").read_text(encoding="utf-8"))
    del raw["why"]["PrivateDevices"]
    with pytest.raises(BadInput, match="PrivateDevices=false"):
        load_unit_data(json.dumps(raw))
    raw = json.loads(resources.files("glm53").joinpath("data/systemd-unit.json").read_text(encoding="utf-8"))
    del raw["why"]["ProtectClock"]
    with pytest.raises(BadInput, match="ProtectClock has no why"):
        load_unit_data(json.dumps(raw))


# --- rendering --------------------------------------------------------------------------------------------------


def test_the_unit_runs_doctor_then_serve_with_the_data_files_hardening() -> None:
    unit = render_unit(_settings(), load_unit_data())
    text = unit.text
    assert _words(_directives(text, "ExecStartPre")[0]) == [
        "/opt/glm53/bin/glm53",
        "doctor",
        "--profile",
        "agent-256k",
        "--model-dir",
        MODEL_DIR,
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    serve = _words(_directives(text, "ExecStart")[0])
    assert serve[:2] == ["/opt/glm53/bin/glm53", "serve"]
    assert serve[-1] == "--skip-preflight"
    assert "--listen-all" not in serve and "--api-key-file" not in serve
    # Optional ("-"): a missing checkpoint is explained by glm53 doctor in ExecStartPre (systemd.exec(5)).
    assert parse_paths(_directives(text, "ReadOnlyPaths")[0], specifiers=SPECIFIERS) == [(MODEL_DIR, True)]
    environment = _environment(text)
    assert environment["HF_HUB_OFFLINE"] == "1"
    assert environment["VLLM_NO_USAGE_STATS"] == "1"
    assert environment["DO_NOT_TRACK"] == "1"
    assert environment["VLLM_CACHE_ROOT"].startswith("/var/cache/glm53")
    assert environment["PATH"].startswith("/opt/glm53/bin:")
    assert _directives(text, "CapabilityBoundingSet") == [""]
    assert _directives(text, "LimitMEMLOCK") == ["infinity"]
    assert _directives(text, "SystemCallFilter") == ["@system-service", "@resources", "~@privileged"]
    assert _directives(text, "WantedBy") == ["multi-user.target"]
    assert not _directives(text, "LoadCredential")
    # The why of each loosening travels into the unit as a comment.
    assert "# a private /dev hides the GPUs" in text
    assert "#   MemoryDenyWriteExecute: Triton" in text
    assert unit.sections["Service"]["ProtectProc"] == "invisible"


def test_paths_with_spaces_percent_dollar_and_quotes_are_quoted_for_systemd() -> None:
    model = '/srv/my models/glm 5% "$HOME"'
    exe = "/opt/glm 53/bin/glm53"
    unit = render_unit(
        _settings(model_dir=Path(model), glm53=Path(exe), bin_dir=Path("/opt/glm 53/bin")), load_unit_data()
    )
    exec_start = _directives(unit.text, "ExecStart")[0]
    assert exec_start.startswith('"/opt/glm 53/bin/glm53" "serve" ')
    assert '"/srv/my models/glm 5%% \\"$$HOME\\""' in exec_start
    assert _words(exec_start)[:6] == [exe, "serve", "--profile", "agent-256k", "--model-dir", model]
    # ReadOnlyPaths= expands specifiers but not variables: % doubled, $ kept.
    assert _directives(unit.text, "ReadOnlyPaths") == ['"-/srv/my models/glm 5%% \\"$HOME\\""']
    assert _environment(unit.text)["PATH"].startswith("/opt/glm 53/bin:")


def test_a_control_character_in_a_path_is_refused() -> None:
    with pytest.raises(BadInput, match="control character"):
        render_unit(_settings(model_dir=Path("/srv/models/a\nExecStart=/bin/sh")), load_unit_data())


def test_the_api_key_and_env_file_are_credentials_never_in_argv() -> None:
    unit = render_unit(
        _settings(api_key_file=Path("/etc/glm53/api key"), env_file=Path("/etc/glm53/50%.env")), load_unit_data()
    )
    assert _directives(unit.text, "LoadCredential") == ["api-key:/etc/glm53/api key", "env-file:/etc/glm53/50%%.env"]
    serve = _words(_directives(unit.text, "ExecStart")[0])
    assert serve[serve.index("--api-key-file") + 1] == "/run/credentials/glm53.service/api-key"
    assert serve[serve.index("--env-file") + 1] == "/run/credentials/glm53.service/env-file"
    assert "/etc/glm53/api key" not in _directives(unit.text, "ExecStart")[0]


# --- the command line: validation through resolve_launch --------------------------------------------------------


def test_cli_refuses_all_interfaces_without_listen_all(tmp_path: Path) -> None:
    result = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--host", "0.0.0.0")
    assert result.code == 2
    assert isinstance(result.error, BadInput)
    assert "--listen-all" in (result.error.fix or "")
    assert result.stdout == ""


def test_cli_listen_all_with_an_api_key_file(tmp_path: Path) -> None:
    key = tmp_path / "api key"
    key.write_text("sk-test-secret\n")
    key.chmod(0o600)
    result = run_unit_cli(
        "--model-dir",
        MODEL_DIR,
        "--glm53",
        str(_glm53_exe()),
        "--host",
        "0.0.0.0",
        "--listen-all",
        "--api-key-file",
        str(key),
    )
    assert result.code == 0, result.stderr
    assert "sk-test-secret" not in result.stdout
    assert _directives(result.stdout, "LoadCredential") == [f"api-key:{key.resolve()}"]
    serve = _words(_directives(result.stdout, "ExecStart")[0])
    assert serve[-8:] == [
        *("--host", "0.0.0.0", "--port", "8000", "--listen-all"),
        *("--api-key-file", "/run/credentials/glm53.service/api-key", "--skip-preflight"),
    ]


def test_cli_warns_when_listening_on_all_interfaces_without_a_key() -> None:
    result = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--host", "0.0.0.0", "--listen-all")
    assert result.code == 0
    assert "without an API key" in result.stderr


def test_cli_refuses_bad_input_through_the_library(tmp_path: Path) -> None:
    exe = str(_glm53_exe())
    unknown = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", exe, "--profile", "agent-265k")
    assert unknown.code == 2 and "agent-256k" in unknown.stderr  # the choices, named
    home = run_unit_cli("--model-dir", "/home/someone/models/glm53", "--glm53", exe)
    assert home.code == 2 and home.error is not None and "ProtectHome" in home.error.message
    missing = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(tmp_path / "nope"))
    assert missing.code == 2 and missing.error is not None and "--glm53" in missing.error.message
    env_file = tmp_path / "bad.env"
    env_file.write_text("MAX_MODEL_LENGTH=131072\n")
    bad_key = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", exe, "--env-file", str(env_file))
    assert bad_key.code == 2 and bad_key.error is not None
    world_readable = tmp_path / "key"
    world_readable.write_text("k\n")
    world_readable.chmod(0o644)
    open_key = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", exe, "--api-key-file", str(world_readable))
    assert open_key.code == 2 and open_key.error is not None and "chmod 600" in (open_key.error.fix or "")


def test_cli_writes_the_unit_file_and_prints_json(tmp_path: Path) -> None:
    out = tmp_path / "glm53.service"
    written = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--out", str(out))
    assert written.code == 0 and written.stdout == ""
    assert "[Service]" in out.read_text()
    again = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--out", str(out))
    assert again.code == 2 and again.error is not None and "--force" in (again.error.fix or "")
    assert run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--out", str(out), "--force").code == 0
    printed = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--json")
    assert printed.code == 0
    payload = json.loads(printed.stdout)
    assert payload["sections"]["Service"]["LimitMEMLOCK"] == "infinity"
    assert payload["sections"]["Service"]["ExecStart"].endswith('"--skip-preflight"')
    assert payload["text"] == out.read_text()


def test_the_unit_runs_the_glm53_that_renders_it(tmp_path: Path) -> None:
    """`.venv/bin/glm53 systemd-unit` needs no glm53 on PATH: argv[0] is the console script's own path."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    script = venv_bin / "glm53"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert systemd.running_glm53(str(script), "/usr/bin/python3") == script
    relative = os.path.relpath(script)
    assert systemd.running_glm53(relative, "/usr/bin/python3") == Path(os.path.abspath(relative))
    # `python -m glm53.cli.main`: the glm53 beside the interpreter.
    assert systemd.running_glm53("/x/glm53/cli/main.py", str(venv_bin / "python")) == script
    assert systemd.running_glm53("/x/main.py", "/nowhere/python") is None


# --- systemd itself -------------------------------------------------------------------------------------------


def _analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _verify_clean(unit: Path) -> None:
    result = _analyze("verify", str(unit), cwd=unit.parent)
    output = result.stdout + result.stderr
    # verify exits 0 on some warnings (an unknown key), which name the file: neither may appear.
    assert result.returncode == 0, output
    assert unit.name not in output, output


def exposure(unit: Path) -> float:
    result = _analyze("security", "--offline=yes", "--no-pager", str(unit), cwd=unit.parent)
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


@needs_systemd_analyze
def test_systemd_verifies_the_rendered_unit_and_rates_it_at_most_2(tmp_path: Path) -> None:
    unit = tmp_path / "glm53.service"
    result = run_unit_cli("--model-dir", MODEL_DIR, "--glm53", str(_glm53_exe()), "--out", str(unit))
    assert result.code == 0, result.stderr
    _verify_clean(unit)
    score = exposure(unit)
    sys.stderr.write(f"\n[systemd-analyze security] glm53.service: {score}\n")
    assert score <= MAX_EXPOSURE


@needs_systemd_analyze
def test_systemd_parses_quoted_paths_credentials_and_listen_all(tmp_path: Path) -> None:
    # The binary must exist for verify, so the quoting of its path (spaces, %) is checked by systemd itself.
    bin_dir = tmp_path / "glm 53% bin"
    bin_dir.mkdir()
    exe = bin_dir / "glm53"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    settings = _settings(
        model_dir=Path("/srv/my models/glm 5%"),
        glm53=exe,
        bin_dir=bin_dir,
        host="0.0.0.0",
        listen_all=True,
        api_key_file=tmp_path / "api key",
        env_file=tmp_path / "agent.env",
    )
    unit = tmp_path / "glm53.service"
    unit.write_text(render_unit(settings, load_unit_data()).text)
    _verify_clean(unit)
    assert exposure(unit) <= MAX_EXPOSURE
