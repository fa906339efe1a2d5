"""A rich progress bar in bytes with a bytes/s rate, fed from hashing or download threads; silent when not
on a TTY."""

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
    """Implements glm53.checkpoint.hashing.HashProgress (and glm53.checkpoint.hub.DownloadProgress) on a rich Progress,
    whose updates are thread-safe."""

    def __init__(self, progress: Progress, description: str) -> None:
        self._progress = progress
        self._description = description
        self._task: TaskID | None = None

    def start(self, total_bytes: int, files: int, done: int = 0) -> None:
        """A new bar over `files` files; `done` bytes already there (a resumed download) start it off."""
        self._task = self._progress.add_task(
            f"{self._description} {files} files", total=total_bytes, completed=done
        )

    def stage(self, description: str) -> ByteProgress:
        """Another bar in the same display, for a later step of the same command (one live display at a time)."""
        return ByteProgress(self._progress, description)

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
