"""Run the `glm53` command line in-process, through the same `main()` (and so the same exit codes) as the
installed console script, capturing stdout and stderr."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass
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


__all__ = ["CliResult", "run_glm53"]


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
