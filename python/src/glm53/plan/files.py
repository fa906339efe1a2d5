"""What plans write, for every engine: KEY=VALUE lines and the output directory they go to."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from glm53.errors import BadInput


def env_lines(env: Mapping[str, str]) -> str:
    """KEY=VALUE lines, values quoted for the shell where needed (';' in CPU lists)."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())


def check_out_dir(directory: Path, *, what: str = "--out") -> None:
    """Refuse an output directory that cannot be one (an existing file, a path through a file), before any work."""
    for parent in (directory, *directory.parents):
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(
                    f"{what} {directory}: {parent} is a file, not a directory",
                    fix=f"give {what} a directory (it is created, and plan.json, plan.env and the rankings go "
                    "there), or another path",
                )
            return


def make_out_dir(directory: Path, *, what: str = "--out") -> None:
    check_out_dir(directory, what=what)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"{what}: cannot create the directory {directory}: {exc.strerror}",
            fix="check that its parent is writable, or give another path",
        ) from exc
