"""Small local HTTP servers for the bench tests: a quiet handler base and a context that serves it."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar


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

    def _send_events(self, events: list[Any]) -> None:
        """A whole server-sent event stream: each of `events` as JSON, then [DONE]."""
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, stream.encode(), "text/event-stream")

    def _send_models(self, model: str, max_model_len: int) -> None:
        """A /v1/models answer: the one model, with its max_model_len."""
        self._json(200, {"data": [{"id": model, "max_model_len": max_model_len}]})

    def _read_json(self) -> Any:
        """The request's JSON body ({} when it has none)."""
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def _send_char_tokens(self, prompt: str) -> None:
        """A /tokenize answer: one token per character of `prompt`."""
        tokens = [ord(c) % 251 + 1 for c in prompt]
        self._send(200, json.dumps({"count": len(tokens), "tokens": tokens}).encode())

    def log_message(self, *args: object) -> None:
        pass


class TokenizingHandler(QuietHandler):
    """A stand-in OpenAI-compatible server's common part: /v1/models (the one `model`) and vLLM's /tokenize (one
    token per character); every other GET goes to `get` (404 here), every other POST, with its body, to `post`."""

    model = "stand-in"
    max_model_len = 4096

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send_models(self.model, self.max_model_len)
        else:
            self.get()

    def get(self) -> None:
        self._send(404, b"{}")

    def do_POST(self) -> None:
        body = self._read_json()
        if self.path == "/tokenize":
            self._send_char_tokens(body["prompt"])
        else:
            self.post(body)

    def post(self, body: Any) -> None:
        raise NotImplementedError


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


def vllm_completion_event(request_id: str, created: int, model: str, text: str, finish: str | None) -> bytes:
    """One `/v1/completions` stream event exactly as vLLM's OpenAI server writes it."""
    event = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}],
        "usage": None,
    }
    return b"data: " + json.dumps(event, separators=(", ", ": ")).encode() + b"\n\n"


def vllm_usage_event(request_id: str, created: int, model: str, prompt: int, completion: int) -> bytes:
    event = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion},
    }
    return b"data: " + json.dumps(event, separators=(", ", ": ")).encode() + b"\n\n"


class VllmLikeHandler(QuietHandler):
    """A stand-in vLLM: /v1/models, /tokenize, /metrics (the engine's counters and timing histograms) and
    streamed /v1/completions that decode one token every `token_gap_s`. With `burst`, the server decodes at
    that pace but holds every event back and releases the whole stream at once at the end (what a buffering
    proxy, or a server under some loads, does); its /metrics still tell the engine's true timings. With
    `burst_first` N, only the first N streams are held back (a host that was briefly too busy). Without
    `metrics`, /metrics answers 404 (a server that exports none: nothing can vouch for a held-back stream)."""

    model = "stand-in"
    max_model_len = 4096
    token_gap_s = 0.003
    burst = False
    burst_first: int | None = None
    metrics = True
    streams = 0
    api_key: str | None = None
    lock = threading.Lock()
    counters: ClassVar[dict[str, float]] = {}

    @classmethod
    def reset(
        cls,
        *,
        burst: bool = False,
        token_gap_s: float = 0.003,
        api_key: str | None = None,
        burst_first: int | None = None,
        metrics: bool = True,
    ) -> None:
        cls.burst, cls.token_gap_s, cls.api_key = burst or burst_first is not None, token_gap_s, api_key
        cls.burst_first, cls.streams, cls.metrics = burst_first, 0, metrics
        cls.counters = {
            "vllm:prompt_tokens_total": 0.0,
            "vllm:generation_tokens_total": 0.0,
            "vllm:num_preemptions_total": 0.0,
            "vllm:request_decode_time_seconds_sum": 0.0,
            "vllm:request_decode_time_seconds_count": 0.0,
            "vllm:time_to_first_token_seconds_sum": 0.0,
            "vllm:time_to_first_token_seconds_count": 0.0,
        }

    def _authorized(self) -> bool:
        if self.api_key is None or self.headers.get("Authorization") == f"Bearer {self.api_key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model, "max_model_len": self.max_model_len}]})
        elif self.path == "/metrics" and self.metrics:
            with self.lock:
                text = "".join(f"{name} {value}\n" for name, value in self.counters.items())
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"error": {"message": "not here"}})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._read_json()
        if self.path == "/tokenize":
            self._send_char_tokens(body["prompt"])
            return
        n, prompt = int(body["max_tokens"]), len(body["prompt"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.end_headers()
        with self.lock:
            type(self).streams += 1
            hold = self.burst and (self.burst_first is None or self.streams <= self.burst_first)
        started = time.perf_counter()
        held: list[bytes] = []
        first_token = last_token = started
        for i in range(n):
            time.sleep(self.token_gap_s)
            last_token = time.perf_counter()
            if i == 0:
                first_token = last_token
            event = vllm_completion_event("cmpl-1", 1, self.model, "a", "length" if i == n - 1 else None)
            if hold:
                held.append(event)
            else:
                self._chunk(event)
        with self.lock:
            counters = type(self).counters
            counters["vllm:prompt_tokens_total"] += prompt
            counters["vllm:generation_tokens_total"] += n
            counters["vllm:request_decode_time_seconds_sum"] += last_token - first_token
            counters["vllm:request_decode_time_seconds_count"] += 1
            counters["vllm:time_to_first_token_seconds_sum"] += first_token - started
            counters["vllm:time_to_first_token_seconds_count"] += 1
        tail = vllm_usage_event("cmpl-1", 1, self.model, prompt, n) + b"data: [DONE]\n\n"
        self._chunk(b"".join(held) + tail)  # then the connection closes (HTTP/1.0), as the stream's end

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()


class VllmBackendHandler(VllmLikeHandler):
    """One box of a fleet: VllmLikeHandler with counters of its own (make one class per box with
    `vllm_backend()`), vLLM's request and prefix-cache counters under their real names
    (`vllm:request_success_total{finished_reason=...}`, `vllm:prefix_cache_queries_total`,
    `vllm:prefix_cache_hits_total`) and streamed chat turns answering with a `list_files` tool call. A prompt's
    prefix-cache hits are the characters (tokens here) it shares with the longest matching earlier prompt on this
    box, in blocks of 16, as vLLM's block-granular prefix cache counts them."""

    seen: ClassVar[list[str]] = []
    # Its tokens are characters: the agent's scripted conversation alone is some 5,000 of them.
    max_model_len = 32768

    @classmethod
    def reset(cls, *, burst: bool = False, token_gap_s: float = 0.001, api_key: str | None = None) -> None:
        super().reset(burst=burst, token_gap_s=token_gap_s, api_key=api_key)
        cls.lock = threading.Lock()
        cls.seen = []
        cls.counters.update(
            {
                'vllm:request_success_total{engine="0",finished_reason="length",model_name="stand-in"}': 0.0,
                'vllm:request_success_total{engine="0",finished_reason="tool_calls",model_name="stand-in"}': 0.0,
                'vllm:prefix_cache_queries_total{engine="0",model_name="stand-in"}': 0.0,
                'vllm:prefix_cache_hits_total{engine="0",model_name="stand-in"}': 0.0,
            }
        )

    @classmethod
    def _count(cls, prompt: str, finished: str) -> None:
        with cls.lock:
            shared = max((_common_prefix(prompt, old) for old in cls.seen), default=0)
            cls.seen.append(prompt)
            c = cls.counters
            c['vllm:prefix_cache_queries_total{engine="0",model_name="stand-in"}'] += len(prompt)
            c['vllm:prefix_cache_hits_total{engine="0",model_name="stand-in"}'] += shared // 16 * 16
            c[f'vllm:request_success_total{{engine="0",finished_reason="{finished}",model_name="stand-in"}}'] += 1

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"")
        else:
            super().do_GET()

    def do_POST(self) -> None:
        if self.path == "/v1/chat/completions":
            if not self._authorized():
                return
            body = self._read_json()
            prompt = json.dumps(body["messages"])
            time.sleep(self.token_gap_s)
            call = {"index": 0, "id": "c1", "function": {"name": "list_files", "arguments": '{"path": "."}'}}
            events = [
                {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": 12}},
            ]
            with self.lock:
                self.counters["vllm:prompt_tokens_total"] += len(prompt)
                self.counters["vllm:generation_tokens_total"] += 12
                # The engine's own timing of the turn (its 12 tokens decoded one token_gap_s apart).
                self.counters["vllm:request_decode_time_seconds_sum"] += 11 * self.token_gap_s
                self.counters["vllm:request_decode_time_seconds_count"] += 1
                self.counters["vllm:time_to_first_token_seconds_sum"] += self.token_gap_s
                self.counters["vllm:time_to_first_token_seconds_count"] += 1
            self._count(prompt, "tool_calls")
            self._send_events(events)
            return
        if self.path == "/v1/completions":
            # Counted before the stream's end, as vLLM counts a request finished before its last event is read.
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            body = json.loads(raw or b"{}")
            self._count("".join(chr(t % 1000 + 32) for t in body.get("prompt", [])), "length")
            self.rfile = _Replay(raw)  # type: ignore[assignment]
        super().do_POST()


class _Replay:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int = -1) -> bytes:
        out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def vllm_backend(name: str) -> type[VllmBackendHandler]:
    """A box's handler class, with counters of its own (reset)."""
    cls = type(f"Backend_{name}", (VllmBackendHandler,), {"counters": {}, "seen": []})
    cls.reset()
    return cls


class StandInRouter(QuietHandler):
    """A sticky-session router in miniature, with what vllm-router's `consistent_hash` guarantees (every request
    with the same X-Session-ID header goes to the same backend; every request without one to the first) and a
    placement the tests know instead of a hash's: the n-th new key goes to backend n mod the number of backends.
    (Bench keys are random, so a real hash could put six sessions on one box, one run in 32.) POSTs are
    streamed back as they arrive; GETs (/v1/models) go to the first backend. The router has no /metrics of its
    own here (404), as on its port."""

    backends: ClassVar[list[str]] = []
    routed: ClassVar[list[tuple[str, str]]] = []
    placed: ClassVar[dict[str, str]] = {}
    lock = threading.Lock()

    def _pick(self) -> str:
        key = self.headers.get("X-Session-ID", "")
        if not key:
            return self.backends[0]
        with self.lock:
            placed = type(self).placed
            if key not in placed:
                placed[key] = self.backends[len(placed) % len(self.backends)]
            return placed[key]

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self._json(404, {"error": {"message": "not here"}})
            return
        import httpx

        response = httpx.get(self.backends[0] + self.path, timeout=10)
        self._send(response.status_code, response.content)

    def do_POST(self) -> None:
        import httpx

        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        target = self._pick()
        type(self).routed.append((self.headers.get("X-Session-ID", ""), target))
        headers = {"Content-Type": "application/json"}
        if self.headers.get("Authorization"):
            headers["Authorization"] = self.headers["Authorization"]
        with httpx.stream("POST", target + self.path, content=raw, headers=headers, timeout=30) as response:
            self.send_response(response.status_code)
            self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
            self.end_headers()
            for chunk in response.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()


@contextmanager
def stand_in_fleet(boxes: int = 2) -> Iterator[tuple[str, list[str], list[type[VllmBackendHandler]]]]:
    """`boxes` stand-in vLLM servers behind a stand-in router: yields (router URL, backend URLs, handlers)."""
    handlers = [vllm_backend(chr(ord("a") + i)) for i in range(boxes)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve_http(h)) for h in handlers]
        router = type("Router", (StandInRouter,), {"backends": urls, "routed": [], "placed": {}})
        yield stack.enter_context(serve_http(router)), urls, handlers
