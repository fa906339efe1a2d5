"""Incremental Server-Sent Events parser over raw byte chunks.

Work is per line (bytes.splitlines, bytes.rfind), never per character, so parsing stays far below the
cost of the JSON decoding that follows it. Only `data:` fields matter for OpenAI-style streams; `event:`,
`id:`, `retry:` and comment lines are accepted and ignored.
"""

from __future__ import annotations

_DATA = b"data:"


class SSEParser:
    """Feed byte chunks as they arrive; get back the `data` payload of each completed event."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data_lines: list[bytes] = []

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
            return []
        self._buffer = buffer[cut + 1 :]
        return self._consume_lines(buffer[: cut + 1].splitlines())

    def close(self) -> list[bytes]:
        """End of stream: an event still missing its blank line is dispatched as well, so the caller
        can tell a truncated payload (invalid JSON) from a clean end."""
        rest = self._buffer
        self._buffer = b""
        return self._consume_lines([*rest.splitlines(), b""])

    @property
    def pending(self) -> bool:
        """True when bytes or data lines of an unfinished event are buffered."""
        return bool(self._buffer) or bool(self._data_lines)

    def _consume_lines(self, lines: list[bytes]) -> list[bytes]:
        events: list[bytes] = []
        data_lines = self._data_lines
        for line in lines:
            if not line:
                if data_lines:
                    events.append(data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines))
                    data_lines = []
                continue
            if line.startswith(_DATA):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            # Other fields (event, id, retry) and ":" comments carry nothing the benchmark needs.
        self._data_lines = data_lines
        return events
