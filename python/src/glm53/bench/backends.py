"""The backends behind a router (`--backend URL`, repeatable): which box served what, from each box's own
`/metrics`.

A bench through `glm53 router` measures the router's URL; the router's own counters cannot say which box did the
work, the boxes' can. Each backend's vLLM counters are read before and after the bench (requests finished,
prompt and generated tokens, prefix-cache hits and queries) and the differences are the per-backend split.
Between the requests the counters are read again, so each request or turn names the box that served it (one
request runs at a time, so exactly one box's `vllm:request_success_total` moves). The sum of the boxes' counters
is also what the per-request checks read (`implausible_timing` compares the client's times with the engine's):
through a router, the server that has the engine's timings is whichever box served the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx
from pydantic import BaseModel, Field

from glm53.bench.metrics import parse_prometheus
from glm53.errors import BadInput, Unavailable

MAX_BACKENDS = 64
# The vLLM counter names (prometheus_client adds `_total`), summed over their label sets.
REQUESTS = "vllm:request_success"
_SPLIT_COUNTERS = {
    "requests": REQUESTS,
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
}
_METRICS_BYTES = 8 * 1024 * 1024


def parse_backends(urls: Sequence[str] | None) -> list[str]:
    """`--backend` values, checked: http(s) URLs of a server (no path), each once."""
    chosen: list[str] = []
    for raw in urls or ():
        url = raw.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"--backend {raw!r} is not an http(s) URL", fix="e.g. --backend http://10.0.0.11:8000")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as exc:
            raise BadInput(f"--backend {raw!r} is not a valid URL: {exc}") from exc
        if not parsed.host:
            raise BadInput(f"--backend {raw!r} names no host", fix="e.g. --backend http://10.0.0.11:8000")
        if parsed.path not in ("", "/") or parsed.query:
            raise BadInput(
                f"--backend {raw!r}: give the server's URL without a path (its /metrics is read)",
                fix="e.g. --backend http://10.0.0.11:8000",
            )
        if url in chosen:
            raise BadInput(f"--backend {url} is listed twice", fix="list each backend once")
        chosen.append(url)
    if len(chosen) > MAX_BACKENDS:
        raise BadInput(f"--backend: {len(chosen)} backends, more than {MAX_BACKENDS}")
    return chosen


class BackendSplit(BaseModel):
    """One backend's share of the bench: its own counters' increase over the bench."""

    url: str
    requests: float | None = Field(None, description="requests it finished (vllm:request_success_total)")
    requests_pct: float | None = Field(None, description="% of all the backends' finished requests")
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_pct: float | None = Field(None, description="hits / queries, in tokens, %")
    served: int = Field(0, description="requests or turns of this bench attributed to it, one by one")
    sessions: int = Field(0, description="agent sessions (tasks) whose turns it served")
    error: str | None = Field(None, description="why its counters could not be read, before or after")


class FleetSplit(BaseModel):
    """The per-backend split of one bench through a router."""

    backends: list[BackendSplit]
    requests: float | None = Field(None, description="finished requests, all backends")
    prefix_cache_hit_pct: float | None = Field(None, description="all backends' hits / queries, %")
    unattributed: int = Field(0, description="requests or turns no backend's counter showed (or two did)")
    sessions: int = Field(0, description="agent sessions")
    sessions_on_one_backend: int = Field(0, description="agent sessions whose every turn was on one backend")


Snapshot = dict[str, dict[str, float] | None]


def _counter(sample: Mapping[str, float] | None, base: str) -> float | None:
    if sample is None:
        return None
    for name in (f"{base}_total", base):
        if name in sample:
            return sample[name]
    return None


def _pct(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


class BackendMetrics:
    """Reads every backend's /metrics; `metrics_text` is their sum (for the per-request checks), and the
    latest per-backend counters are kept for the attribution of each request."""

    def __init__(self, urls: Sequence[str], *, api_key: str | None = None, timeout_s: float = 10.0) -> None:
        self.urls = list(urls)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), headers=headers)
        self.errors: dict[str, str] = {}
        self.latest: Snapshot = {}

    def close(self) -> None:
        self._http.close()

    def _read(self, url: str) -> dict[str, float] | None:
        try:
            with self._http.stream("GET", f"{url}/metrics") as response:
                if response.status_code != 200:
                    self.errors[url] = f"/metrics answered HTTP {response.status_code}"
                    return None
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > _METRICS_BYTES:
                        self.errors[url] = f"/metrics longer than {_METRICS_BYTES:,} bytes"
                        return None
        except httpx.HTTPError as exc:
            self.errors[url] = f"/metrics unreachable: {type(exc).__name__}"
            return None
        sample = parse_prometheus(body.decode("utf-8", "replace"))
        if _counter(sample, REQUESTS) is None:
            self.errors[url] = f"/metrics has no {REQUESTS}_total (not a vLLM server?)"
            return None
        return sample

    def snapshot(self) -> Snapshot:
        self.latest = {url: self._read(url) for url in self.urls}
        return self.latest

    def check(self) -> None:
        """Every backend's counters can be read, before anything is measured (exit 3 naming the others)."""
        self.snapshot()
        failed = [f"{url} ({self.errors[url]})" for url, sample in self.latest.items() if sample is None]
        if failed:
            raise Unavailable(
                f"cannot read the counters of {len(failed)} of {len(self.urls)} backends: {'; '.join(failed)}",
                fix="--backend lists the vLLM servers behind the router, each as its own URL",
            )

    def metrics_text(self) -> str | None:
        """The backends' counters summed (as one server's exposition), or None when one cannot be read."""
        snap = self.snapshot()
        if any(sample is None for sample in snap.values()):
            return None
        totals: dict[str, float] = {}
        for sample in snap.values():
            for name, value in (sample or {}).items():
                totals[name] = totals.get(name, 0.0) + value
        return "".join(f"{name} {value!r}\n" for name, value in totals.items())


class SplitTracker:
    """The split of one bench: `start()` before it, `observe()` after each request (which backend served
    it, from the counters last read), `finish()` at the end."""

    def __init__(self, source: BackendMetrics) -> None:
        self.source = source
        self.start_snapshot: Snapshot = {}
        self._previous: Snapshot = {}
        self.served: list[str | None] = []
        self.sessions: dict[str, set[str]] = {}

    def start(self) -> None:
        self.start_snapshot = dict(self.source.snapshot())
        self._previous = self.start_snapshot

    def observe(self, session: str | None = None) -> str | None:
        """The backend whose finished-request counter moved since the last observation (the counters are
        those the request's own after-snapshot read), or None when not exactly one did."""
        current = self.source.latest
        moved = [
            url
            for url in self.source.urls
            if (after := _counter(current.get(url), REQUESTS)) is not None
            and after > (_counter(self._previous.get(url), REQUESTS) or 0.0)
        ]
        self._previous = dict(current)
        backend = moved[0] if len(moved) == 1 else None
        self.served.append(backend)
        if session is not None:
            self.sessions.setdefault(session, set())
            if backend is not None:
                self.sessions[session].add(backend)
        return backend

    def finish(self) -> FleetSplit:
        end = self.source.snapshot()
        return split_of(
            self.source.urls, self.start_snapshot, end, self.served, self.sessions, errors=self.source.errors
        )


def split_of(
    urls: Sequence[str],
    before: Snapshot,
    after: Snapshot,
    served: Sequence[str | None] = (),
    sessions: Mapping[str, set[str]] | None = None,
    *,
    errors: Mapping[str, str] | None = None,
) -> FleetSplit:
    rows: list[BackendSplit] = []
    for url in urls:
        start, end = before.get(url), after.get(url)
        values: dict[str, float | None] = {}
        for field, base in _SPLIT_COUNTERS.items():
            a, b = _counter(start, base), _counter(end, base)
            values[field] = None if a is None or b is None else max(0.0, b - a)
        error = None if start is not None and end is not None else (errors or {}).get(url, "counters unreadable")
        rows.append(
            BackendSplit(
                url=url,
                **values,
                prefix_cache_hit_pct=_pct(values["prefix_cache_hits"], values["prefix_cache_queries"]),
                served=sum(1 for s in served if s == url),
                sessions=sum(1 for used in (sessions or {}).values() if url in used),
                error=error,
            )
        )
    requests = [r.requests for r in rows if r.requests is not None]
    total = sum(requests) if requests and len(requests) == len(rows) else None
    for row in rows:
        row.requests_pct = _pct(row.requests, total)
    hits = [r.prefix_cache_hits for r in rows if r.prefix_cache_hits is not None]
    queries = [r.prefix_cache_queries for r in rows if r.prefix_cache_queries is not None]
    all_sessions = sessions or {}
    return FleetSplit(
        backends=rows,
        requests=total,
        prefix_cache_hit_pct=_pct(sum(hits), sum(queries)) if hits and queries else None,
        unattributed=sum(1 for s in served if s is None),
        sessions=len(all_sessions),
        sessions_on_one_backend=sum(1 for used in all_sessions.values() if len(used) == 1),
    )


__all__ = ["BackendMetrics", "BackendSplit", "FleetSplit", "SplitTracker", "parse_backends", "split_of"]
