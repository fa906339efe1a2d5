"""One output object for every command: human tables on stdout, or JSON on stdout for `--json`.

Messages, warnings and progress always go to stderr so that `--json` output stays parseable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console

from glm53.safetext import shown

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.text import Text


class SafeConsole(Console):
    """A rich Console that shows every string it renders through `glm53.safetext.shown`: a file name, a
    hostname or a server's answer with escape sequences or bidi overrides is shown escaped, never acted on,
    and a URL's `user:SECRET@` is masked. Strings are rich's one way in (tables, messages, panels)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(shown(text), **kwargs)


class Output:
    def __init__(self, *, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.out = SafeConsole(soft_wrap=True)
        self.err = SafeConsole(stderr=True, soft_wrap=True)

    def result(self, value: BaseModel | dict[str, Any] | list[Any], render: Callable[[Console], None]) -> None:
        """Emit a command's result: as JSON when asked, otherwise through `render`."""
        if self.json_mode:
            payload = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            # allow_nan=False: every --json output parses with any strict JSON reader.
            sys.stdout.write(json.dumps(payload, indent=2, allow_nan=False) + "\n")
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

    @contextmanager
    def progress(self, description: str, *, total: int | None = None, in_bytes: bool = False) -> Iterator[ProgressBar]:
        """A progress bar on stderr while the block runs, with the elapsed time (counts) or the transfer rate
        (`in_bytes`); silent off a terminal and with --json. A bytes bar appears at its first `start`."""
        if not self.interactive:
            yield ProgressBar(None, description, echo=self.info)
            return
        # heavy: rich.progress takes ~0.1 s to import; only a bar on a terminal needs it
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        description_column = TextColumn("{task.description}")
        columns = (
            (description_column, BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
            if in_bytes
            else (SpinnerColumn(), description_column, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        )
        with Progress(*columns, console=self.err, transient=True) as display:
            bar = ProgressBar(display, description, echo=self.info)
            if not in_bytes:
                bar.update(description, 0, total)
            yield bar


class ProgressBar:
    """One bar of a live display, or nothing when the display is off (then `step` lines still go to stderr).

    Implements glm53.checkpoint.hashing.HashProgress and glm53.checkpoint.hub.DownloadProgress (`start`,
    `advance`: fed from worker threads, and rich's updates are thread-safe), the planner's staged counts
    (`update`) and bench's one line per finished item (`step`)."""

    def __init__(self, display: Progress | None, description: str, *, echo: Callable[[str], None]) -> None:
        self._display = display
        self._description = description
        self._echo = echo
        self._task: TaskID | None = None

    def start(self, total_bytes: int, files: int, done: int = 0) -> None:
        """The bar over `files` files; `done` bytes already there (a resumed download) start it off."""
        self.update(f"{self._description} {files} files", done, total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._display is not None and self._task is not None:
            self._display.update(self._task, advance=nbytes)

    def update(self, description: str, done: int, total: int | None) -> None:
        """Show `done` of `total` (None: not known yet) under `description`."""
        if self._display is None:
            return
        if self._task is None:
            self._task = self._display.add_task(description, total=total, completed=done)
        else:
            self._display.update(self._task, description=description, completed=done, total=total)

    def extend(self, items: int = 1) -> None:
        """`items` more to do than the total said (a repeated measurement)."""
        if self._display is not None and self._task is not None:
            task = next(task for task in self._display.tasks if task.id == self._task)
            if task.total is not None:
                self._display.update(self._task, total=task.total + items)

    def step(self, line: str) -> None:
        """One item finished: print its line (above the bar) and count it."""
        if self._display is None:
            self._echo(line)
            return
        self._display.console.print(line, highlight=False)
        self.advance(1)

    def stage(self, description: str) -> ProgressBar:
        """Another bar in the same display, for a later step of the same command (one live display at a time)."""
        return ProgressBar(self._display, description, echo=self._echo)
