"""A stand-in glm53 box for router tests: one chat turn at a time, the others wait in FIFO order (vLLM with
max_num_seqs=1), each turn taking the capacity model's service time at a compressed time scale, streamed back
as vLLM's OpenAI server streams a chat completion.

A prompt's tokens are its messages' words times `tokens_per_word` (the stand-in's tokenizer: a client sends a
16K-token prompt in a few hundred bytes, so that parsing it costs the router and the box next to nothing). The
box's prefix cache holds the last `cached_conversations` conversations it served, by X-Session-ID (which the
router forwards): a turn of one of them, or a conversation's first turn (system and user message only), finds
`cache_hit` of its prompt cached, as glm53.router.simulation assumes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.bench_fixtures import QuietHandler


@dataclass
class BoxConfig:
    prefill_tok_s: float
    decode_tok_s: float
    cache_hit: float
    cached_conversations: int
    scale: float  # real seconds per modelled second
    tokens_per_word: int = 1  # the stand-in's tokenizer: a word of the messages is this many tokens
    model: str = "glm53-standin"


@dataclass
class BoxState:
    """One box's queue, cache and log (shared by its handler threads)."""

    config: BoxConfig
    lock: threading.Condition = field(default_factory=threading.Condition)
    next_ticket: int = 0
    serving: int = 0
    cache: OrderedDict[str, None] = field(default_factory=OrderedDict)
    served: list[tuple[str, float]] = field(default_factory=list)  # (session, modelled service seconds)

    def run(self, session: str, prompt_tokens: int, answer_tokens: int, opens: bool) -> float:
        """Wait for this box's turn (FIFO), then hold it for the turn's service time; the modelled seconds."""
        with self.lock:
            ticket = self.next_ticket
            self.next_ticket += 1
            while self.serving != ticket:
                self.lock.wait()
            warm = opens or session in self.cache
            self.cache[session] = None
            self.cache.move_to_end(session)
            if len(self.cache) > self.config.cached_conversations:
                self.cache.popitem(last=False)
        c = self.config
        uncached = prompt_tokens * (1.0 - c.cache_hit) if warm else prompt_tokens
        took = uncached / c.prefill_tok_s + answer_tokens / c.decode_tok_s
        time.sleep(took * c.scale)
        with self.lock:
            self.served.append((session, took))
            self.serving += 1
            self.lock.notify_all()
        return took


def _words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def _chunk(request_id: str, created: int, model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    event = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def box_handler(state: BoxState) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": state.config.model, "object": "model"}]})
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = self._read_json()
            if self.path != "/v1/chat/completions":
                self._json(404, {"detail": "Not Found"})
                return
            messages = body.get("messages") or []
            prompt = _words(messages) * state.config.tokens_per_word
            answer = int(body.get("max_tokens") or 1)
            session = self.headers.get("X-Session-ID") or ""
            state.run(session, prompt, answer, opens=len(messages) <= 2)
            self._stream(body, prompt, answer)

        def _stream(self, body: dict[str, Any], prompt: int, answer: int) -> None:
            rid, created, model = f"chatcmpl-{id(self):x}", int(time.time()), str(body.get("model"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [
                _chunk(rid, created, model, {"role": "assistant", "content": ""}, None),
                _chunk(rid, created, model, {"content": " ".join(["ok"] * answer)}, None),
                _chunk(rid, created, model, {}, "length"),
            ]
            usage = {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer}
            if (body.get("stream_options") or {}).get("include_usage"):
                final = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
                events.append(b"data: " + json.dumps({**final, "choices": [], "usage": usage}).encode() + b"\n\n")
            events.append(b"data: [DONE]\n\n")
            for data in events:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def serve_box(state: BoxState) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), box_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


__all__ = ["BoxConfig", "BoxState", "serve_box"]
