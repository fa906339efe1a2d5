"""HTTP edge of the benchmark: the OpenAI-compatible endpoints of a vLLM server, through httpx.

Streaming requests never raise for what the server does (status codes, drops, timeouts, bad events):
those come back inside a `StreamOutcome`. Setup calls (`/tokenize`, `/v1/models`) raise `CheckFailed`,
since nothing can be measured without them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from pydantic import BaseModel

from glm53.bench.sse import SSEParser
from glm53.bench.stream import StreamAccumulator, StreamOutcome
from glm53.errors import BadInput, CheckFailed, Unavailable

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


class ServerInfo(BaseModel):
    base_url: str
    model: str
    max_model_len: int | None = None
    vllm_version: str | None = None


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
            raise BadInput(f"--base-url {base_url!r} is not an http(s) URL", hint="e.g. http://127.0.0.1:8000")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The read timeout bounds the silence between two chunks; a 260K prompt's prefill can be
        # several minutes of silence, hence the long default.
        timeout = httpx.Timeout(connect=10.0, read=timeout_s, write=120.0, pool=30.0)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers, transport=transport)

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
            raise CheckFailed(f"{self.base_url}/v1/models lists no model", hint="is the server still loading?")
        chosen = next((m for m in entries if isinstance(m, dict) and m.get("id") == model), None)
        if model is not None and chosen is None:
            names = ", ".join(str(m.get("id")) for m in entries if isinstance(m, dict))
            raise BadInput(f"--model {model!r} is not served at {self.base_url}", hint=f"served: {names}")
        chosen = chosen or entries[0]
        max_len = chosen.get("max_model_len")
        version: str | None = None
        try:
            payload = self._get_json("/version")
            version = str(payload.get("version")) if isinstance(payload, dict) else None
        except CheckFailed:
            version = None
        return ServerInfo(
            base_url=self.base_url,
            model=str(chosen.get("id")),
            max_model_len=int(max_len) if isinstance(max_len, int) else None,
            vllm_version=version,
        )

    def tokenize(self, model: str, text: str) -> list[int]:
        """Token ids of `text` without special tokens (they are added by whoever frames the prompt)."""
        payload = self._post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        tokens = payload.get("tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise CheckFailed(f"{self.base_url}/tokenize answered without a 'tokens' list of integers")
        return tokens

    def metrics_text(self) -> str | None:
        """The Prometheus exposition of `/metrics`, or None when the server does not offer it."""
        try:
            response = self._http.get("/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    # -- streamed generation --------------------------------------------------------------------------------

    def stream(self, path: str, body: dict[str, Any]) -> StreamOutcome:
        """POST `body` with streaming on and time every event; never raises for server behaviour."""
        content = json.dumps({**body, "stream": True}, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        parser = SSEParser()
        events = StreamAccumulator()
        status: int | None = None
        clock = time.perf_counter
        started = clock()
        try:
            with self._http.stream("POST", path, content=content, headers=headers) as response:
                status = response.status_code
                if status >= 400:
                    response.read()
                    events.fail(f"HTTP {status}: {_error_text(response)}")
                else:
                    for chunk in response.iter_bytes():
                        events.feed(parser.feed(chunk), clock() - started)
                    events.feed(parser.close(), clock() - started)
        except httpx.TimeoutException as exc:
            events.fail(f"timed out after {self.timeout_s:g} s without data ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            events.fail(f"connection failed: {type(exc).__name__}: {exc}")
        return events.outcome(end_s=clock() - started, http_status=status)

    def post_json(self, path: str, body: dict[str, Any]) -> tuple[int | None, Any, str | None]:
        """Non-streamed POST for quality gates: (status, JSON body or None, error text or None)."""
        try:
            response = self._http.post(path, json=body)
        except httpx.TimeoutException:
            return None, None, f"timed out after {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            return None, None, f"connection failed: {type(exc).__name__}: {exc}"
        if response.status_code >= 400:
            return response.status_code, None, f"HTTP {response.status_code}: {_error_text(response)}"
        try:
            return response.status_code, response.json(), None
        except ValueError:
            return response.status_code, None, "response is not JSON"

    # -- helpers ------------------------------------------------------------------------------------------

    def _get_json(self, path: str) -> Any:
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"cannot reach {self.base_url}{path}: {exc}", hint="start the server, or pass --base-url"
            ) from exc
        return _json_or_fail(response, self.base_url + path)

    def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"cannot reach {self.base_url}{path}: {exc}", hint="start the server, or pass --base-url"
            ) from exc
        return _json_or_fail(response, self.base_url + path)


def _json_or_fail(response: httpx.Response, url: str) -> Any:
    if response.status_code >= 400:
        raise CheckFailed(f"{url} answered HTTP {response.status_code}: {_error_text(response)}")
    try:
        return response.json()
    except ValueError as exc:
        raise CheckFailed(f"{url} did not answer JSON") from exc


def _error_text(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:200].strip() or response.reason_phrase
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:300]
        return str(error)[:300]
    return str(payload)[:300]
