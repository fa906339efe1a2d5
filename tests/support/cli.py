"""Run the `glm53` command line in-process, through the same `main()` (and so the same exit codes) as the
installed console script, capturing stdout and stderr."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_glm53(*args: str) -> CliResult:
    from glm53.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    code = 0
    sys.argv = ["glm53", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return CliResult(code, out.getvalue(), err.getvalue())


def run_bench(kind: str, base_url: str, out: Path, *extra: str, backends: Sequence[str] = ()) -> CliResult:
    """`glm53 bench KIND --base-url BASE_URL [--backend URL]... EXTRA... --out OUT`."""
    flags = [flag for url in backends for flag in ("--backend", url)]
    return run_glm53("bench", kind, "--base-url", base_url, *flags, *extra, "--out", str(out))


def bench_json(kind: str, base_url: str, out: Path, *extra: str, backends: Sequence[str] = ()) -> Any:
    """`run_bench(...)` with --json, which must exit 0: the KIND section of what it prints."""
    result = run_bench(kind, base_url, out, *extra, "--json", backends=backends)
    assert result.code == 0, result.stderr
    return result.json()[kind]


__all__ = ["CliResult", "bench_json", "run_bench", "run_glm53"]


def run_with_capsys(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """`glm53 ARGS` through main(), its output read from pytest's capture: (exit code, stdout, stderr)."""
    from glm53.cli.main import main

    monkeypatch.setattr(sys, "argv", ["glm53", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
