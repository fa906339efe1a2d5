"""The two renderers of the glm53 unit, `glm53 systemd-unit` (Python, glm53.serve.systemd) and the NixOS module
(nix/module.nix through nix/lib.nix), write byte-identical launch directives for the same installation, and
systemd reads them back as the argv and paths that were meant, for checkpoint directories with spaces, `%`,
`$`, quotes, backslashes, `;` and non-ASCII letters.

Read back twice: by tests/support/systemd_parse.py (a model of systemd's parser, for every word), and by systemd
itself: `systemd-analyze verify` fails a unit whose command is not an executable, so a glm53 installed under a
hostile directory name proves the first word is unquoted and unescaped exactly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from glm53.serve.systemd import UnitSettings, command_line, load_unit_data, optional_path, render_unit
from tests.support.nixenv import NIX_ENV
from tests.support.nixeval import ROOT, SERVER, needs_nixpkgs_lib, prefixes
from tests.support.systemd_parse import directives, parse_credential, parse_exec, parse_paths

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
CREDENTIALS = "/run/credentials/glm53.service"
SPECIFIERS = {"d": CREDENTIALS, "n": "glm53.service"}
HOSTILE = [
    "/srv/my models/glm 5%",
    "/srv/models/$HOME and ${HOME} and $$",
    '/srv/it\'s "quoted"',
    "/srv/back\\slash\\n",
    "/srv/; semi ; colon",
    "/srv/ünïcödé/%d %n",
]
IDS = ["space-percent", "dollar", "quotes", "backslash", "semicolon", "unicode-specifiers"]


@pytest.fixture
def nix_module(request: pytest.FixtureRequest) -> None:
    """Skips, saying why, where the module cannot be evaluated (no nix, no NIXPKGS_LIB)."""
    for mark in needs_nixpkgs_lib:
        if mark.name == "skipif" and mark.args[0]:
            pytest.skip(mark.kwargs["reason"])


def _nix_string(text: str) -> str:
    """A Nix string literal for `text` (JSON's escapes are Nix's, but `${` must not start an interpolation)."""
    return json.dumps(text, ensure_ascii=False).replace("${", "\\${")


def _nix_unit(model_dir: str) -> str:
    config = f'enable = true; engine = "exllamav3"; modelDir = {_nix_string(model_dir)};'
    result = SERVER.evaluate(config, fields=("failedAssertions", "unit"))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["failedAssertions"] == []
    unit: str = data["unit"]
    return unit


def _python_unit(model_dir: str, env_file: str) -> str:
    exe = prefixes()["exl3"] / "bin" / "glm53"
    settings = UnitSettings(
        profile="exl3-2x3090",
        model_dir=Path(model_dir),
        host="127.0.0.1",
        port=8000,
        env_file=Path(env_file),
        glm53=exe,
        bin_dir=exe.parent,
    )
    return render_unit(settings, load_unit_data()).text


LAUNCH = ("ExecStartPre", "ExecStart", "ReadOnlyPaths", "LoadCredential")


@pytest.mark.parametrize("model_dir", HOSTILE, ids=IDS)
@pytest.mark.usefixtures("nix_module")
def test_both_renderers_write_the_same_launch_and_systemd_reads_back_the_path(model_dir: str) -> None:
    nix = _nix_unit(model_dir)
    (credential,) = directives(nix, "LoadCredential")
    env_file = parse_credential(credential, specifiers=SPECIFIERS)[1]
    python = _python_unit(model_dir, env_file)
    for key in LAUNCH:
        assert directives(nix, key) == directives(python, key), key

    exe = str(prefixes()["exl3"] / "bin" / "glm53")
    (exec_start,) = directives(nix, "ExecStart")
    assert parse_exec(exec_start, specifiers=SPECIFIERS, env={"HOME": "/var/cache/glm53"}) == [
        exe,
        *("serve", "--profile", "exl3-2x3090", "--model-dir", model_dir),
        *("--env-file", f"{CREDENTIALS}/env-file", "--host", "127.0.0.1", "--port", "8000", "--skip-preflight"),
    ]
    (exec_pre,) = directives(nix, "ExecStartPre")
    assert parse_exec(exec_pre, specifiers=SPECIFIERS)[4:6] == ["--model-dir", model_dir]
    # Read-only, and optional: a missing checkpoint reaches ExecStartPre (glm53 doctor), not a namespace error.
    (paths,) = directives(nix, "ReadOnlyPaths")
    assert parse_paths(paths, specifiers=SPECIFIERS) == [(model_dir, True)]


def test_a_control_character_is_refused_by_both(tmp_path: Path) -> None:
    from glm53.errors import BadInput

    with pytest.raises(BadInput, match="control character"):
        command_line(["/opt/glm53/bin/glm53", "serve", "--model-dir", "/srv/a\nExecStart=/bin/sh"])
    with pytest.raises(BadInput, match="control character"):
        optional_path("/srv/a\tb")
    if shutil.which("nix") is None:
        pytest.skip("nix is not installed")
    for text in ("/srv/a\nExecStart=/bin/sh", "/srv/a\tb"):
        for function in ("escapeExecArg", "optionalPath"):
            expr = f"(import {ROOT}/nix/lib.nix {{}}).{function} {_nix_string(text)}"
            result = subprocess.run(
                ["nix", "eval", "--impure", "--expr", expr], env=NIX_ENV, capture_output=True, text=True, timeout=60
            )
            assert result.returncode != 0 and "contains a control character" in result.stderr


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", ["glm 53% x", "ünï ; cödé (1)"], ids=["space-percent", "unicode-semicolon"])
def test_systemd_itself_resolves_the_command_under_a_hostile_directory(tmp_path: Path, name: str) -> None:
    """verify fails unless systemd's own parse of ExecStart's first word is the executable's path exactly."""
    bin_dir = tmp_path / name / "bin"
    exe = _executable_glm53(bin_dir)
    settings = UnitSettings(
        profile="agent-256k",
        model_dir=Path(f"/srv/{name}"),
        host="127.0.0.1",
        port=8000,
        glm53=exe,
        bin_dir=bin_dir,
    )
    text = render_unit(settings, load_unit_data()).text
    assert _verify(tmp_path, text).returncode == 0
    # The same unit with the command's path one character off is refused: verify does read the path.
    broken = text.replace(command_line([str(exe)]), command_line([str(exe) + "x"]), 2)
    refused = _verify(tmp_path, broken)
    assert refused.returncode != 0 and "is not executable" in refused.stderr


def _executable_glm53(bin_dir: Path) -> Path:
    """A glm53 that does nothing, in `bin_dir` (made): systemd's verify checks the command exists."""
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "glm53"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def _verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    unit = tmp_path / "glm53.service"
    unit.write_text(text)
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        assert "glm53.service" not in result.stdout + result.stderr, result.stderr
    return result


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", ["it's", 'a"b', "back\\slash", "a$b"])
def test_a_command_path_systemd_would_not_run_is_refused_by_the_renderer(tmp_path: Path, name: str) -> None:
    from glm53.errors import BadInput
    from glm53.serve.resolve import ServeRequest
    from glm53.serve.systemd import unit_settings

    bin_dir = tmp_path / name / "bin"
    exe = _executable_glm53(bin_dir)
    with pytest.raises(BadInput, match="systemd does not accept in a command's path"):
        unit_settings(ServeRequest(profile="agent-256k", model_dir=Path("/srv/models/glm53")), glm53=exe)
    if "$" not in name:  # systemd's own rule for quotes and backslashes ("special characters")
        unit = f"[Service]\nExecStart={command_line([str(exe)])}\n"
        assert "special characters" in _verify(tmp_path, unit).stderr
