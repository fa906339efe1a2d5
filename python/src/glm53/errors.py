"""One error hierarchy: every error knows its exit code and the fix to suggest.

    Glm53Error (exit 1)
     ├── CheckFailed          exit 1  a check ran and found a problem (mismatch, failed gate, failed doctor check)
     │    └── Infeasible      exit 1  glm53.plan.vllm.planner: the request cannot be planned on this host
     ├── BadInput             exit 2  the user's input is wrong: file, field or flag; nothing was changed
     └── Unavailable          exit 3  the environment cannot do it: no GPU, a missing library or program,
                                      the Hub or the server unreachable

The CLI turns them into a one-line message plus a fix at a single boundary (`glm53.cli.main`); commands
leave through these classes only, never through a bare exit code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class Glm53Error(Exception):
    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


class CheckFailed(Glm53Error):
    exit_code = 1


class BadInput(Glm53Error):
    exit_code = 2


class Unavailable(Glm53Error):
    exit_code = 3


def invalid_document(exc: ValidationError, source: str, *, fix: str | None = None) -> BadInput:
    """A pydantic validation failure of a file or document, as BadInput naming the first bad field."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    return BadInput(f"{source}: {where}: {first['msg']}", fix=fix)


__all__ = ["BadInput", "CheckFailed", "Glm53Error", "Unavailable", "invalid_document"]
