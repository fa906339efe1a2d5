"""One output object for every command: human tables on stdout, or JSON on stdout for `--json`.

Messages, warnings and progress always go to stderr so that `--json` output stays parseable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from rich.console import Console


class Output:
    def __init__(self, *, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.out = Console(soft_wrap=True)
        self.err = Console(stderr=True, soft_wrap=True)

    def result(self, value: BaseModel | dict[str, Any] | list[Any], render: Callable[[Console], None]) -> None:
        """Emit a command's result: as JSON when asked, otherwise through `render`."""
        if self.json_mode:
            payload = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
            sys.stdout.flush()
        else:
            render(self.out)

    def info(self, message: str) -> None:
        self.err.print(message, highlight=False)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {message}", highlight=False)

    @property
    def interactive(self) -> bool:
        return self.err.is_terminal and not self.json_mode
