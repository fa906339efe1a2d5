"""Small local HTTP servers for the bench tests: a quiet handler base and a context that serves it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing, with helpers to send a whole response."""

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode())

    def _read_json(self) -> Any:
        """The request's JSON body ({} when it has none)."""
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def _send_char_tokens(self, prompt: str) -> None:
        """A /tokenize answer: one token per character of `prompt`."""
        tokens = [ord(c) % 251 + 1 for c in prompt]
        self._send(200, json.dumps({"count": len(tokens), "tokens": tokens}).encode())

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on 127.0.0.1 at a free port for the duration of the block; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
