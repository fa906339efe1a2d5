"""The fleet file: the backends behind one router and the settings it runs with, typed and checked.

A fleet file is TOML (`fleet.toml`) or JSON (`fleet.json`) with the same fields:

    policy = "sticky_least_loaded"      # a session stays on its backend; a new one goes to the least busy
    host = "127.0.0.1"
    port = 8100
    api_key_file = "/run/keys/glm53"   # optional; required for a host other than loopback

    [[backends]]
    url = "http://10.0.0.11:8000"
    [[backends]]
    url = "http://10.0.0.12:8000"

    [limits]                            # optional, every value below has a default chosen for this workload
    queue_size = 32
    queue_timeout_secs = 300

Every default is the one for this workload (one GLM-5.3-Flash box serves one request at a time, agent turns
live on the prefix cache of the box that served the session so far) and is explained where it is declared.
Nothing here starts or reaches anything: `glm53.router.launch` turns a Fleet into the router's argv.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from glm53.constants import DEFAULT_HOST, DEFAULT_PORT
from glm53.errors import BadInput, invalid_document
from glm53.fsutil import parse_json, read_text_bounded
from glm53.safetext import hostname_problem, quoted

# A fleet file lists a few hundred backends at most; anything near this size is not a fleet file.
MAX_FLEET_BYTES = 1024 * 1024
# The deepest a valid fleet file nests (top level -> table -> value); refused well before Python's recursion limit.
MAX_DEPTH = 8
MAX_BACKENDS = 512
DEFAULT_ROUTER_PORT = 8100

# The router's policies this module can launch (vllm-router 0.1.17 also has kv_aware, which needs KV event
# streams from the engines, and the PD-disaggregation modes; neither fits a fleet of whole glm53 boxes).
Policy = Literal["consistent_hash", "sticky_least_loaded", "cache_aware", "power_of_two", "round_robin", "random"]
POLICIES: tuple[str, ...] = Policy.__args__  # type: ignore[attr-defined]

# Strict: `port = true` or `"8100"` is a mistake in the file, not a value to coerce (true would be port 1).
_FORBID = ConfigDict(extra="forbid", frozen=True, strict=True)


class Backend(BaseModel):
    """One glm53 server (`glm53 serve`), by the URL its OpenAI API answers under (without /v1)."""

    model_config = _FORBID

    url: str = Field(max_length=2048)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # Messages quote the URL with any user:SECRET@ masked and control characters escaped (`shown`): they
        # reach terminals and build logs (a NixOS build renders the fleet).
        quoted_url = quoted(value)
        if value != value.strip() or not value.isprintable():
            raise ValueError(f"{quoted_url} holds white space or control characters")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{quoted_url} is not an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError(f"{quoted_url} carries credentials: put the key in api_key_file")
        if not parts.hostname:
            raise ValueError(f"{quoted_url} names no host")
        if (problem := hostname_problem(parts.hostname)) is not None:
            raise ValueError(f"{quoted_url}: the host {problem}")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{quoted_url}: {exc}") from None
        if port is None or port == 0:
            raise ValueError(f"{quoted_url} names no port (glm53 serve listens on {DEFAULT_PORT} by default)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{quoted_url}: give the server's root URL, without /v1 or any path")
        host = parts.hostname.lower()
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}:{port}"


class Limits(BaseModel):
    model_config = _FORBID

    # One request per backend at a time is kept by each backend itself (max_num_seqs=1: vLLM runs one and queues
    # the rest in its own waiting queue). vllm-router 0.1.17's --max-concurrent-requests is a token bucket
    # refilled at that many requests per second, not a per-backend gate: set to the number of boxes it
    # throttled to 2 requests/s and answered 408 within a second (measured, tests/test_router.py), so it is
    # only a flood guard here, far above what a fleet of single-sequence boxes serves.
    max_concurrent_requests: int = Field(default=256, ge=1, le=1_000_000)
    queue_size: int = Field(default=64, ge=0, le=100_000)
    # A turn at 256k context takes minutes (prefill 513 tok/s), so a queued request may wait a few turns.
    queue_timeout_secs: int = Field(default=600, ge=1, le=86_400)
    # The longest single request: a full 256k prefill plus a long answer at ~50 tok/s.
    request_timeout_secs: int = Field(default=1800, ge=1, le=86_400)


class Health(BaseModel):
    model_config = _FORBID

    # Lose nothing when a box dies: check every second and take a box out after the first failed check, so
    # that at most ~1 s of requests reach a dead box, and those are retried on another one (Retry below).
    interval_secs: int = Field(default=1, ge=1, le=3600)
    failure_threshold: int = Field(default=1, ge=1, le=100)
    # Back in after two good checks (~2 s): a restarted box rejoins quickly without flapping.
    success_threshold: int = Field(default=2, ge=1, le=100)
    # vLLM answers /health from its API process even while the engine is busy with a long request.
    timeout_secs: int = Field(default=5, ge=1, le=600)
    endpoint: str = Field(default="/health", pattern=r"^/[A-Za-z0-9._~/-]{0,200}$")


class Retry(BaseModel):
    model_config = _FORBID

    # A request that fails to reach its box (connection refused or reset before an answer) is sent again,
    # to another healthy box. Measured with vllm-router 0.1.17: with its defaults the requests routed to a
    # killed box failed until the circuit breaker opened; with 3 retries from 50 ms and a 1 s health check,
    # every one succeeded on the other box. A retry cannot replay a stream that already started (docs/router.md).
    max_retries: int = Field(default=3, ge=1, le=20)
    initial_backoff_ms: int = Field(default=50, ge=1, le=60_000)
    max_backoff_ms: int = Field(default=2000, ge=1, le=600_000)


class Metrics(BaseModel):
    model_config = _FORBID

    # The router's own Prometheus endpoint; loopback unless asked for.
    host: str = DEFAULT_HOST
    port: int = Field(default=29000, ge=1, le=65535)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return _check_host(value)


class Fleet(BaseModel):
    model_config = _FORBID

    backends: list[Backend] = Field(min_length=1, max_length=MAX_BACKENDS)
    # sticky_least_loaded (vllm-router 0.1.17) keys on the X-Session-ID request header: every turn of a session
    # goes to the box that holds its prefix in cache (the agent profile hits 72.9% of prompt tokens there), and a
    # new session goes to the box with the fewest open sessions, so sessions are spread evenly where
    # consistent_hash's ring piles some boxes up: `glm53 fleet plan --compare` needs the fewest boxes with it
    # (docs/scale-out.md). Clients close a session with POST /finish_session (glm53 bench agent does); an unclosed
    # one counts on its box until idle for 2 hours. A request without the header (or a session id in its body)
    # goes to the least loaded box and is not remembered.
    policy: Policy = "sticky_least_loaded"
    host: str = DEFAULT_HOST
    port: int = Field(default=DEFAULT_ROUTER_PORT, ge=1, le=65535)
    listen_all: bool = False
    # The key the backends are served with (`glm53 serve --api-key-file`): see docs/router.md for who checks it.
    api_key_file: Path | None = Field(default=None, strict=False)  # a string in the file
    limits: Limits = Limits()
    health: Health = Health()
    retry: Retry = Retry()
    metrics: Metrics = Metrics()
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return _check_host(value)

    @model_validator(mode="after")
    def _distinct(self) -> Fleet:
        seen: set[str] = set()
        for backend in self.backends:
            if backend.url in seen:
                raise ValueError(f"backend {backend.url} is listed twice")
            seen.add(backend.url)
            if _same_address(backend.url, self.host, self.port):
                raise ValueError(
                    f"backend {backend.url} is the router's own address ({self.host}:{self.port}): the router "
                    "would send every request to itself"
                )
        if self.retry.max_backoff_ms < self.retry.initial_backoff_ms:
            raise ValueError("retry.max_backoff_ms is below retry.initial_backoff_ms")
        return self


def _check_host(value: str) -> str:
    problem = hostname_problem(value)
    if problem is not None:
        raise ValueError(f"{quoted(value, limit=80)} {problem}")
    return value


_LOOPBACK_NAMES = ("localhost", "localhost.")


def _is_local(host: str) -> bool:
    bare = host.strip("[]").lower()
    if bare in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _same_address(url: str, host: str, port: int) -> bool:
    """Whether `url` (normalised by Backend) reaches the router itself at host:port: the same host, or a
    loopback address while the router listens on loopback or on every address."""
    parts = urlsplit(url)
    if parts.port != port or parts.hostname is None:
        return False
    backend = parts.hostname.strip("[]").lower()
    router = host.strip("[]").lower()
    return backend == router or (_is_local(backend) and (_is_local(router) or router in ("0.0.0.0", "::")))


def _depth(value: Any) -> int:
    """How deeply `value` nests, without recursion (a hostile file must not exhaust the stack here)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_fleet(text: str, *, source: str, fmt: Literal["toml", "json"]) -> Fleet:
    fix = "see docs/router.md for the fleet file's fields"
    if fmt == "json":
        data = parse_json(text, what=source, fix=fix)
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise BadInput(f"{source} is not valid TOML: {exc}", fix=fix) from exc
        except RecursionError as exc:
            raise BadInput(f"{source}: TOML nested too deeply to read", fix=fix) from exc
    if not isinstance(data, dict):
        raise BadInput(f"{source}: the top level must be a table (object) of fleet settings", fix=fix)
    if _depth(data) > MAX_DEPTH:
        raise BadInput(f"{source}: nested deeper than a fleet file ever is ({MAX_DEPTH} levels)", fix=fix)
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise invalid_document(exc, source, fix=f"policies: {', '.join(POLICIES)}; {fix}") from exc


def load_fleet(path: Path) -> Fleet:
    """Read and check a fleet file (.toml or .json). Every problem is BadInput (exit 2) naming the field."""
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise BadInput(f"fleet file {path}: name it *.toml or *.json", fix="the suffix says how to read it")
    text = read_text_bounded(path, what="fleet file", max_bytes=MAX_FLEET_BYTES)
    fleet = parse_fleet(text, source=f"fleet file {path}", fmt="toml" if suffix == ".toml" else "json")
    if fleet.api_key_file is not None and not fleet.api_key_file.is_absolute():
        # Relative to the fleet file, so that a file and its key can move together.
        fleet = fleet.model_copy(update={"api_key_file": (path.parent / fleet.api_key_file).resolve()})
    return fleet


__all__ = ["MAX_FLEET_BYTES", "POLICIES", "Backend", "Fleet", "Health", "Limits", "Retry", "load_fleet", "parse_fleet"]
