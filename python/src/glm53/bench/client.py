"""HTTP edge of the benchmark: the OpenAI-compatible endpoints of a vLLM or TabbyAPI server, through httpx.

TabbyAPI (the exllamav3 engine) speaks the same completions API with three differences the client bridges:
its model card carries the context length in `parameters.max_seq_len`; it tokenizes at `/v1/token/encode`
and `/v1/token/decode` instead of vLLM's `/tokenize`; and its completions take the prompt as text only. A
prompt of token ids is sent as the text whose encoding is exactly that many tokens (found once per prompt by
decoding and re-encoding until the count holds), with `add_bos_token: false` as vLLM's id prompts have none,
so the usage the server reports is checked against the shape as strictly as on vLLM.

Streaming requests never raise for what the server does (status codes, drops, timeouts, bad events, events
that never end, streams that never stop): those come back inside a `StreamOutcome`; non-streamed quality
requests come back as an error text. Setup calls (`/tokenize`, `/v1/models`) raise `CheckFailed` (or
`Unavailable` when the server cannot be reached), since nothing can be measured without them.

Every body read is bounded: a server cannot fill this host's memory with one endless answer or event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
from pydantic import BaseModel

from glm53.bench.sse import EventTooLarge, SSEParser
from glm53.bench.stream import StreamAccumulator, StreamOutcome
from glm53.constants import DEFAULT_BASE_URL
from glm53.errors import BadInput, CheckFailed, Unavailable
from glm53.fsutil import parse_json

# One streamed event of a completion is a token or a usage object (a few hundred bytes; with token ids and
# logprobs a few KiB). 16 MiB is no event a server should send.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# A whole stream, and a whole non-streamed answer (a 260K-token chat answer is a few MiB).
MAX_STREAM_BYTES = 1024 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
# Events carrying tokens beyond max_tokens x n: allowance for a final event that carries only the finish reason.
_EXTRA_TOKEN_EVENTS = 16


class _TooLarge(Exception):
    pass


class ServerInfo(BaseModel):
    base_url: str
    model: str
    max_model_len: int | None = None
    vllm_version: str | None = None
    engine: str = "vllm"  # "tabbyapi" when the model card says TabbyAPI owns it


# Decode/encode rounds to find a text of an exact token count; the count is reached in one or two on real
# tokenizers (a merge across a cut boundary), so more means the tokenizer does not round-trip at all.
_TEXT_ROUNDS = 6


class BenchClient:
    """One connection pool to one server; use as a context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 1800.0,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BadInput(f"--base-url {base_url!r} is not an http(s) URL", fix=f"e.g. {DEFAULT_BASE_URL}")
        try:
            httpx.URL(base_url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise BadInput(
                f"--base-url {base_url!r} is not a valid URL: {exc}", fix=f"e.g. {DEFAULT_BASE_URL}"
            ) from exc
        if api_key is not None and not _header_safe(api_key):
            raise BadInput(
                "the API key holds characters an HTTP header cannot carry (whitespace, control or non-ASCII)",
                fix="check the key (--api-key-file, GLM53_API_KEY, OPENAI_API_KEY or --api-key)",
            )
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        # Where `metrics_text` reads the engine's counters: this server's /metrics, or (through a router, with
        # --backend) the sum of the backends' (glm53.bench.backends).
        self.metrics_source: Callable[[], str | None] | None = None
        # "tabbyapi" once server_info() has seen TabbyAPI's model card: tokenize and prompts go its way.
        self.dialect = "vllm"
        self._texts: dict[tuple[int, ...], str] = {}
        # The rotations already sent, by the hash of the rotated ids: no two runs send the same prompt.
        self._rotations_sent: set[int] = set()
        # Tokens the server generates short of `max_tokens`, measured once (see _output_shortfall).
        self.output_shortfall: int | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The read timeout bounds the silence between two chunks; a 260K prompt's prefill can be
        # several minutes of silence, hence the long default.
        timeout = httpx.Timeout(connect=10.0, read=timeout_s, write=120.0, pool=30.0)
        try:
            self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers, transport=transport)
        except (httpx.InvalidURL, ValueError) as exc:
            raise BadInput(f"--base-url {base_url!r} is not a valid URL: {exc}") from exc

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- setup calls ---------------------------------------------------------------------------------------

    def server_info(self, model: str | None = None) -> ServerInfo:
        models = self._get_json("/v1/models")
        entries = models.get("data") if isinstance(models, dict) else None
        if not isinstance(entries, list) or not entries:
            raise CheckFailed(f"{self.base_url}/v1/models lists no model", fix="is the server still loading?")
        chosen = next((m for m in entries if isinstance(m, dict) and m.get("id") == model), None)
        if model is not None and chosen is None:
            names = ", ".join(str(m.get("id")) for m in entries if isinstance(m, dict))
            raise BadInput(f"--model {model!r} is not served at {self.base_url}", fix=f"served: {names}")
        chosen = chosen or entries[0]
        if not isinstance(chosen, dict):
            raise CheckFailed(f"{self.base_url}/v1/models lists a model that is not an object")
        max_len = chosen.get("max_model_len")
        if chosen.get("owned_by") == "tabbyAPI":
            self.dialect = "tabbyapi"
            parameters = chosen.get("parameters")
            max_len = parameters.get("max_seq_len") if isinstance(parameters, dict) else None
        version: str | None = None
        try:
            payload = self._get_json("/version")
            version = str(payload.get("version")) if isinstance(payload, dict) else None
        except CheckFailed:
            version = None
        return ServerInfo(
            base_url=self.base_url,
            model=str(chosen.get("id")),
            # A length that is not a positive integer (a bool, a float, 0, 10**20) is not one: unknown.
            max_model_len=max_len
            if isinstance(max_len, int) and not isinstance(max_len, bool) and 0 < max_len < 2**53
            else None,
            vllm_version=version[:200] if version is not None else None,
            engine=self.dialect,
        )

    def tokenize(self, model: str, text: str) -> list[int]:
        """Token ids of `text` without special tokens (they are added by whoever frames the prompt)."""
        if self.dialect == "tabbyapi":
            body = {"text": text, "add_bos_token": False, "encode_special_tokens": False}
            path, payload = "/v1/token/encode", self._post_json("/v1/token/encode", body)
        else:
            body = {"model": model, "prompt": text, "add_special_tokens": False}
            path, payload = "/tokenize", self._post_json("/tokenize", body)
        tokens = payload.get("tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise CheckFailed(f"{self.base_url}{path} answered without a 'tokens' list of integers")
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        """TabbyAPI's text of `tokens` (special tokens dropped, as `tokenize` leaves them out)."""
        body = {"tokens": tokens, "add_bos_token": False, "decode_special_tokens": False}
        payload = self._post_json("/v1/token/decode", body)
        text = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            raise CheckFailed(f"{self.base_url}/v1/token/decode answered without a 'text' string")
        return text

    def text_prompt(self, model: str, ids: list[int]) -> str:
        """A text that TabbyAPI encodes to exactly len(ids) tokens (cached per prompt)."""
        key = tuple(ids)
        if key not in self._texts:
            text = self._round_trip_text(model, ids)
            self._texts[key] = self._prefix_text(model, ids) if text is None else text
        return self._texts[key]

    def _round_trip_text(self, model: str, ids: list[int]) -> str | None:
        """Decode, re-encode, adjust: one or two rounds on tokenizers whose decoding round-trips."""
        target, current = len(ids), list(ids)
        for _ in range(_TEXT_ROUNDS):
            text = self.detokenize(current)
            encoded = self.tokenize(model, text)
            if len(encoded) == target:
                return text
            # Too many: cut back; too few: top up from the original ids, then try again.
            current = encoded[:target] if len(encoded) > target else encoded + list(ids[len(encoded) : target])
        return None

    def _prefix_text(self, model: str, ids: list[int]) -> str:
        """For tokenizers whose decoding does not round-trip (a word-level vocabulary decodes with a space
        between tokens, so every round doubles the count): the shortest character prefix of the decoded text
        that the server encodes to the target count, found by bisection. A prefix's count grows with its length
        in steps of one token at most on such tokenizers; the result is checked, never assumed."""
        target = len(ids)
        text = self.detokenize(ids)
        count = len(self.tokenize(model, text))
        while count < target:
            grown = text + text
            grown_count = len(self.tokenize(model, grown))
            if grown_count <= count:
                break
            text, count = grown, grown_count
        if count >= target:
            low, high = 0, len(text)  # count(text[:low]) < target <= count(text[:high])
            while high - low > 1:
                middle = (low + high) // 2
                if len(self.tokenize(model, text[:middle])) >= target:
                    high = middle
                else:
                    low = middle
            if len(self.tokenize(model, text[:high])) == target:
                return text[:high]
        raise CheckFailed(
            f"{self.base_url}: no text encodes to exactly {target} tokens (neither the server's decoding nor a "
            "prefix of it)",
            fix="this tokenizer does not round-trip its own output; use another shape or --style",
        )

    def metrics_text(self) -> str | None:
        """The Prometheus exposition of `/metrics`, or None when the server does not offer it (or answers
        something unreadable or huge)."""
        if self.metrics_source is not None:
            return self.metrics_source()
        try:
            status, raw = self._request("GET", "/metrics")
        except (httpx.HTTPError, _TooLarge):
            return None
        return raw.decode("utf-8", "replace") if status == 200 else None

    # -- streamed generation --------------------------------------------------------------------------------

    def stream(self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> StreamOutcome:
        """POST `body` with streaming on and time every event; never raises for server behaviour. `headers` are
        sent besides (the X-Session-ID a router keys its sticky sessions on)."""
        if self.dialect == "tabbyapi" and isinstance(body.get("prompt"), list):
            try:
                body = self._tabby_body(body)
            except (CheckFailed, Unavailable) as exc:
                failed = StreamAccumulator(max_token_events=None)
                failed.fail(exc.message)
                return failed.outcome(end_s=0.0, http_status=None)
        content = json.dumps({**body, "stream": True}, separators=(",", ":")).encode()
        headers = {**(headers or {}), "Content-Type": "application/json", "Accept": "text/event-stream"}
        parser = SSEParser(max_event_bytes=MAX_EVENT_BYTES)
        events = StreamAccumulator(max_token_events=_token_event_limit(body))
        status: int | None = None
        clock = time.perf_counter
        started = clock()
        try:
            with self._http.stream("POST", path, content=content, headers=headers) as response:
                status = response.status_code
                if status >= 400:
                    raw = _read_bounded(response.iter_bytes(), MAX_BODY_BYTES)
                    events.fail(f"HTTP {status}: {_error_text(raw, response.reason_phrase)}")
                elif (kind := response.headers.get("content-type", "event-stream")) and "event-stream" not in kind:
                    raw = _read_bounded(response.iter_bytes(), MAX_BODY_BYTES)
                    events.fail(f"HTTP {status} answered {kind[:60]}, not an event stream: {_error_text(raw, '')}")
                else:
                    self._consume(response, parser, events, started)
        except httpx.TimeoutException as exc:
            events.fail(f"timed out after {self.timeout_s:g} s without data ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            events.fail(f"connection failed: {type(exc).__name__}: {str(exc)[:300]}")
        except EventTooLarge as exc:
            events.fail(f"malformed stream: {exc}")
        except _TooLarge as exc:
            events.fail(str(exc))
        except Exception as exc:  # whatever else the server's bytes provoke: an invalid run, never a crash
            events.fail(f"stream could not be read: {type(exc).__name__}: {str(exc)[:200]}")
        return events.outcome(end_s=clock() - started, http_status=status)

    def _tabby_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """TabbyAPI takes text only and has no cache_salt: its page cache reuses any earlier prompt's prefix.
        The salt instead rotates the ids (same length, same text style, another first page), so that no run
        is served from an earlier run's cache."""
        ids = list(body["prompt"])
        salt = str(body.get("cache_salt") or "")
        if salt and len(ids) > 1:
            ids = self._unsent_rotation(ids, int.from_bytes(salt.encode(), "big") % len(ids))
        model = str(body.get("model", ""))
        sent = {k: v for k, v in body.items() if k != "cache_salt"} | {"add_bos_token": False}
        prompt = self.text_prompt(model, ids)
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 0:
            sent["max_tokens"] = body["max_tokens"] + self._output_shortfall(sent, ids)
        return sent | {"prompt": prompt}

    def _unsent_rotation(self, ids: list[int], shift: int) -> list[int]:
        """The ids rotated by `shift`, or by the next shift whose rotation no earlier run sent: two salts can
        pick the same shift, and a tiled prompt repeats itself every period."""
        for step in range(len(ids)):
            start = (shift + step) % len(ids)
            rotated = ids[start:] + ids[:start]
            key = hash(tuple(rotated))
            if key not in self._rotations_sent:
                self._rotations_sent.add(key)
                return rotated
        return ids[shift:] + ids[:shift]  # every rotation sent already: more runs than distinct rotations

    def _output_shortfall(self, body: dict[str, Any], ids: list[int]) -> int:
        """How many tokens fewer than `max_tokens` the server generates: ExLlamaV3 1.4.6 stops one short
        (generator/job.py: `self.max_new_tokens = max_new_tokens - 1 or 1`), which would make every run's
        output one token short of its shape. Measured once per server with a short request of the same form,
        so an engine that generates what it is asked gets 0; anything but 0 or 1 is left for the run's own
        usage check to report."""
        if self.output_shortfall is None:
            probe_tokens = 4
            probe = body | {"prompt": self.text_prompt(str(body.get("model", "")), ids[:8]), "max_tokens": probe_tokens}
            usage = self.stream("/v1/completions", probe).usage
            shortfall = probe_tokens - usage.completion_tokens if usage is not None else 0
            self.output_shortfall = shortfall if shortfall in (0, 1) else 0
        return self.output_shortfall

    def _consume(self, response: httpx.Response, parser: SSEParser, events: StreamAccumulator, started: float) -> None:
        """Feed the stream's events until it ends or is broken. Data that never completes an event (keep-alive
        comments forever) is a silence as long as --timeout; a stream past MAX_STREAM_BYTES is given up."""
        clock = time.perf_counter
        received = 0
        last_event = clock()
        for chunk in response.iter_bytes():
            now = clock()
            received += len(chunk)
            if received > MAX_STREAM_BYTES:
                raise _TooLarge(f"stream longer than {MAX_STREAM_BYTES:,} bytes: given up")
            payloads = parser.feed(chunk)
            if payloads:
                last_event = now
                events.feed(payloads, now - started)
            elif now - last_event > self.timeout_s:
                events.fail(f"timed out after {self.timeout_s:g} s without an event (only keep-alive data)")
            if events.failed:
                return
        events.feed(parser.close(), clock() - started)

    def post_json(self, path: str, body: dict[str, Any]) -> tuple[int | None, Any, str | None]:
        """Non-streamed POST for quality gates: (status, JSON body or None, error text or None)."""
        try:
            status, raw = self._request("POST", path, json=body)
        except httpx.TimeoutException:
            return None, None, f"timed out after {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            return None, None, f"connection failed: {type(exc).__name__}: {str(exc)[:300]}"
        except _TooLarge as exc:
            return None, None, str(exc)
        if status >= 400:
            return status, None, f"HTTP {status}: {_error_text(raw, '')}"
        try:
            return status, parse_json(raw, what="the response"), None
        except BadInput as exc:
            return status, None, f"response is not JSON ({exc.message[:200]})"

    def finish_session(self, session_id: str) -> bool:
        """Close a conversation on a vllm-router in front of the server (`POST /finish_session?session_id=`,
        vllm-router 0.1.17), so that its sticky_least_loaded policy stops counting it on its box. True when the
        router took it; a server that is not a router answers 404, and nothing is lost. Never raises."""
        try:
            status, _ = self._request("POST", "/finish_session", params={"session_id": session_id})
        except (httpx.HTTPError, _TooLarge):
            return False
        return status == 200

    # -- helpers ------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        """(status, body) with the body read up to MAX_BODY_BYTES (_TooLarge beyond)."""
        with self._http.stream(method, path, **kwargs) as response:
            return response.status_code, _read_bounded(response.iter_bytes(), MAX_BODY_BYTES)

    def _get_json(self, path: str) -> Any:
        return self._setup_call("GET", path)

    def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        return self._setup_call("POST", path, json=body)

    def _setup_call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = self.base_url + path
        try:
            status, raw = self._request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"cannot reach {url}: {str(exc)[:300]}", fix="start the server, or pass --base-url"
            ) from exc
        except _TooLarge as exc:
            raise CheckFailed(f"{url}: {exc}") from exc
        if status >= 400:
            raise CheckFailed(f"{url} answered HTTP {status}: {_error_text(raw, '')}")
        try:
            return parse_json(raw, what="the answer")
        except BadInput as exc:
            raise CheckFailed(f"{url} did not answer JSON ({exc.message[:200]})") from exc


def _read_bounded(chunks: Iterator[bytes], limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"answer longer than {limit:,} bytes: given up")
        parts.append(chunk)
    return b"".join(parts)


def _token_event_limit(body: dict[str, Any]) -> int | None:
    """At most one event per token asked for (max_tokens x n), plus a little; None without a max_tokens."""
    max_tokens, n = body.get("max_tokens"), body.get("n", 1)
    if not isinstance(max_tokens, int) or not isinstance(n, int):
        return None
    return max_tokens * max(n, 1) + _EXTRA_TOKEN_EVENTS


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable() and not any(c.isspace() for c in value)


def _error_text(raw: bytes, reason: str) -> str:
    """The message of an error body: the OpenAI `error.message`, else the start of the text."""
    try:
        payload = parse_json(raw, what="the error")
    except BadInput:
        text = raw[:200].decode("utf-8", "replace").strip()
        return " ".join(text.split()) or reason
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:300]
        return str(error)[:300]
    return str(payload)[:300]
