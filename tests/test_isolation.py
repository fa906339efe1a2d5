"""The suite does not read the caller's shell: profile keys and GLM53_* settings exported there change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from glm53.recipe.profiles import KEYS
from tests.conftest import TEST_CONTROLS, caller_variables

ROOT = Path(__file__).resolve().parents[1]

# A shell set up for serving: each would change a launch, a plan or the lock if a test read it.
CALLERS_SHELL = {
    "MAX_MODEL_LEN": "4096",
    "MAX_NUM_SEQS": "7",
    "GPU_MEMORY_UTILIZATION": "0.5",
    "EXL3_MOE_CPU_SPLIT": "3",
    "GLM53_TABBYAPI_DIR": "/nonexistent/tabbyAPI",
    "GLM53_TABBYAPI_PYTHON": "/nonexistent/python",
    "GLM53_REPRO_LOCK": "/nonexistent/repro.lock.json",
    "GLM53_API_KEY": "from-the-callers-shell",
    "VLLM_API_KEY": "from-the-callers-shell",
    "XDG_RUNTIME_DIR": "/nonexistent/run",
    "VIRTUAL_ENV": "/nonexistent/venv",
}


def test_every_variable_of_that_shell_is_cleared_but_the_tests_own_controls() -> None:
    shell = {**CALLERS_SHELL, "GLM53_UPDATE_GOLDEN": "", "PATH": "/usr/bin", "HOME": "/root"}
    cleared = set(caller_variables(shell))
    assert cleared == set(CALLERS_SHELL) - {"VIRTUAL_ENV"}
    assert TEST_CONTROLS.isdisjoint(cleared)
    assert {"MAX_MODEL_LEN", "EXL3_MOE_CPU_SPLIT"} <= set(KEYS)


def test_the_cli_tests_pass_with_a_serving_shell_exported() -> None:
    """The fast CLI tests in a child pytest whose environment holds that shell (MAX_MODEL_LEN=4096 broke the recipe's
    dry run before the suite cleared it)."""
    env = {**os.environ, **CALLERS_SHELL}
    files = ["tests/test_serve_cli.py", "tests/test_profiles.py", "tests/test_cli_surface.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
