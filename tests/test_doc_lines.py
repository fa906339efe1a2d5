"""Every command line of the README and docs/ works as written (tests/support/doc_lines.py says what each one
does): names and synopses name real commands and options; concrete lines run here, against the demo, or stop
with the documented error where they need hardware; a line without an entry, or an entry without a line,
fails. A stale line fails CI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.doc_lines import (
    EXPECTED,
    ROOT,
    DocLine,
    Expect,
    all_lines,
    command_of,
    documents,
    kind,
    option_names,
)
from tests.support.nixenv import NIX_CONFIG

_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S+$")
LINE_TIMEOUT_S = 600


def test_every_command_line_has_its_expectation_and_every_expectation_its_line() -> None:
    concrete = {line.text: line for line in all_lines() if kind(line) == "concrete"}
    missing = [f"{line.path}:{line.line}: {text}" for text, line in concrete.items() if text not in EXPECTED]
    assert not missing, "command lines without an entry in tests/support/doc_lines.py EXPECTED:\n" + "\n".join(missing)
    stale = [text for text in EXPECTED if text not in concrete]
    assert not stale, "entries whose line is no longer in README.md or docs/:\n" + "\n".join(stale)
    assert all(e.why for e in EXPECTED.values() if e.needs == "elsewhere"), "say what runs each line not run here"
    assert len(documents()) > 5 and any(line.path == "README.md" for line in concrete.values())


def test_names_and_synopses_name_real_commands_and_options() -> None:
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    problems: list[str] = []
    checked = 0
    for line in all_lines():
        if kind(line) == "concrete":
            continue
        words = line.text.split()
        where = f"{line.path}:{line.line}: {line.text}"
        if words[0] == "make":
            checked += 1
            problems += [f"{where}: no make target {w}" for w in words[1:] if "=" not in w and w not in targets]
        if words[0] != "glm53":
            continue
        checked += 1
        command, rest = command_of(words[1:])
        if kind(line) == "name" and rest:
            problems.append(f"{where}: not a command")
        known = option_names(command)
        if rest and rest[0] in ("...", "…"):  # `glm53 bench ... --backend`: any of its subcommands
            known = known.union(*(option_names(sub) for sub in getattr(command, "commands", {}).values()))
        for word in rest:
            option = word.split("=", 1)[0].strip("[](),")
            if option.startswith("--") and option not in known:
                problems.append(f"{where}: {command.name} has no option {option}")
    assert checked > 50
    assert not problems, "\n".join(problems)


def _environment(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # As after `. .venv/bin/activate`: the venv's bin first (this interpreter's).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"  # the Hub is out of reach in tests: its lines stop with the documented error
    env["COLUMNS"] = "200"
    env["HOME"] = str(tmp_path / "home")
    return env


def _run(line: DocLine, expect: Expect, cwd: Path, env: dict[str, str], prefix: list[str], **subs: str) -> str:
    text = line.text
    for old, new in subs.items():
        text = text.replace(old, new)
    script = "\n".join([*prefix, text])
    result = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=LINE_TIMEOUT_S
    )
    output = result.stdout + result.stderr
    where = f"{line.path}:{line.line}: {line.text}"
    assert result.returncode == expect.code, (
        f"{where}\nexit {result.returncode}, documented {expect.code}:\n{output[-3000:]}"
    )
    if expect.says is not None:
        assert expect.says in output, f"{where}\nexpected {expect.says!r} in:\n{output[-3000:]}"
    return output


def _by_document(needs: set[str | None]) -> dict[str, list[DocLine]]:
    lines: dict[str, list[DocLine]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for line in all_lines():
        expect = EXPECTED.get(line.text)
        if kind(line) != "concrete" or expect is None or expect.needs not in needs or (line.path, line.text) in seen:
            continue
        seen.add((line.path, line.text))
        lines[line.path].append(line)
    return lines


RUN_HERE = _by_document({None, "hardware"})


@pytest.mark.slow
@pytest.mark.parametrize("document", sorted(RUN_HERE))
def test_lines_run_as_written(document: str, tmp_path: Path) -> None:
    """A document's lines in order, in one scratch directory, as a reader types them."""
    env = _environment(tmp_path)
    prefix: list[str] = []
    for line in RUN_HERE[document]:
        _run(line, EXPECTED[line.text], tmp_path, env, prefix)
        if _ASSIGNMENT.match(line.text):
            prefix.append(line.text)


@pytest.mark.slow
def test_demo_lines_run_against_the_demo(vllm_server: Any, tmp_path: Path) -> None:
    """README's lines for the demo, against the tests' server (the demo's model and profile, its own port)."""
    lines = _by_document({"demo"})
    assert lines, "README shows how to measure the demo"
    env = _environment(tmp_path)
    for document in sorted(lines):
        for line in lines[document]:
            _run(line, EXPECTED[line.text], tmp_path, env, [], **{"http://127.0.0.1:8000": vllm_server.base_url})


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_takes_a_port() -> None:
    def dry(*args: str) -> str:
        result = subprocess.run(["make", "-n", "demo", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert ".venv/bin/glm53 demo --port 8001" in dry("PORT=8001")
    assert re.search(r"\.venv/bin/glm53 demo\s*$", dry(), flags=re.MULTILINE)


@pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (CI installs nix-bin)")
def test_the_readme_s_nix_flag_turns_flakes_on_for_a_stock_nix(tmp_path: Path) -> None:
    # A stock Nix: no experimental features configured, only what a test needs to run offline as root.
    stock = NIX_CONFIG.replace("experimental-features = nix-command flakes\n", "")
    env = {**os.environ, "NIX_CONFIG": stock, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def nix(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nix", *args], env=env, capture_output=True, text=True, timeout=120)

    plain = nix("eval", "--expr", "1 + 1")
    if plain.returncode == 0:
        pytest.skip("this machine's /etc/nix/nix.conf turns flakes on already")
    assert "experimental Nix feature 'nix-command' is disabled" in plain.stderr
    readme = (ROOT / "README.md").read_text()
    flag = "nix --extra-experimental-features 'nix-command flakes'"
    assert f"`{flag} run .#default" in readme and "experimental-features = nix-command flakes" in readme
    flagged = nix("--extra-experimental-features", "nix-command flakes", "eval", "--expr", "1 + 1")
    assert flagged.returncode == 0 and flagged.stdout.strip() == "2", flagged.stderr
