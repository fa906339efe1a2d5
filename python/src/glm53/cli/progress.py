"""A rich progress bar in bytes with a bytes/s rate, fed from hashing threads; silent when not on a TTY."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from glm53.output import Output


class ByteProgress:
    """Implements glm53.hashing.HashProgress on a rich Progress (whose updates are thread-safe)."""

    def __init__(self, progress: Progress, description: str) -> None:
        self._progress = progress
        self._description = description
        self._task: TaskID | None = None

    def start(self, total_bytes: int, files: int) -> None:
        self._task = self._progress.add_task(f"{self._description} {files} files", total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=nbytes)


@contextmanager
def byte_progress(out: Output, description: str) -> Iterator[ByteProgress | None]:
    if not out.interactive:
        yield None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=out.err, transient=True) as progress:
        yield ByteProgress(progress, description)


__all__ = ["ByteProgress", "byte_progress"]
