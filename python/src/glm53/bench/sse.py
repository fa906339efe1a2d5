"""Incremental Server-Sent Events parser over raw byte chunks.

Work is per line (bytes.splitlines, bytes.rfind), never per character, so parsing stays far below the
cost of the JSON decoding that follows it. Only `data:` fields matter for OpenAI-style streams; `event:`,
`id:`, `retry:` and comment lines are accepted and ignored.
"""

from __future__ import annotations

_DATA = b"data:"


class EventTooLarge(ValueError):
    """An event (or a line still missing its end) grew past the parser's `max_event_bytes`."""


class SSEParser:
    """Feed byte chunks as they arrive; get back the `data` payload of each completed event.

    With `max_event_bytes`, an event or a line that grows past it raises `EventTooLarge`, so a server sending
    one endless line cannot fill this host's memory."""

    def __init__(self, *, max_event_bytes: int | None = None) -> None:
        self._buffer = b""
        self._data_lines: list[bytes] = []
        self._data_bytes = 0
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """Return the payloads of the events completed by `chunk` (several lines are joined by b"\\n")."""
        buffer = self._buffer + chunk if self._buffer else chunk
        size = len(buffer)
        if not size:
            return []
        # A trailing "\r" may be the first half of "\r\n": keep its line for the next chunk.
        limit = size - 1 if buffer.endswith(b"\r") else size
        cut = max(buffer.rfind(b"\n", 0, limit), buffer.rfind(b"\r", 0, limit))
        if cut < 0:
            self._buffer = buffer
            self._check(size)
            return []
        self._buffer = buffer[cut + 1 :]
        events = self._consume_lines(buffer[: cut + 1].splitlines())
        self._check(len(self._buffer) + self._data_bytes)
        return events

    def _check(self, pending: int) -> None:
        if self._max is not None and pending > self._max:
            raise EventTooLarge(f"an event larger than {self._max:,} bytes")

    def close(self) -> list[bytes]:
        """End of stream: an event still missing its blank line is dispatched as well, so the caller
        can tell a truncated payload (invalid JSON) from a clean end."""
        rest = self._buffer
        self._buffer = b""
        self._data_bytes = 0
        return self._consume_lines([*rest.splitlines(), b""])

    @property
    def pending(self) -> bool:
        """True when bytes or data lines of an unfinished event are buffered."""
        return bool(self._buffer) or bool(self._data_lines)

    def _consume_lines(self, lines: list[bytes]) -> list[bytes]:
        events: list[bytes] = []
        data_lines = self._data_lines
        data_bytes = self._data_bytes
        for line in lines:
            if not line:
                if data_lines:
                    events.append(data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines))
                    data_lines = []
                    data_bytes = 0
                continue
            if line.startswith(_DATA):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
                data_bytes += len(value)
            # Other fields (event, id, retry) and ":" comments carry nothing the benchmark needs.
        self._data_lines = data_lines
        self._data_bytes = data_bytes
        return events
