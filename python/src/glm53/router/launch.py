"""Fleet -> RouterLaunch: the exact vllm-router argv and the environment it gets. Pure: reads nothing, starts nothing.

The API key never appears here as a value: it travels in GLM53_ROUTER_API_KEY, which `glm53.router.launcher`
takes out of the environment and hands to the router's parsed arguments in-process, so that it is in no
argv (/proc/PID/cmdline is readable by every user).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from glm53.constants import DEFAULT_HOST
from glm53.errors import BadInput
from glm53.router.fleet import Fleet
from glm53.serve.launch import check_host, is_loopback

API_KEY_ENV = "GLM53_ROUTER_API_KEY"


class RouterLaunch(BaseModel):
    model_config = ConfigDict(frozen=True)

    argv: list[str]
    # Exported on top of the inherited environment (never the key itself).
    env: dict[str, str]
    host: str
    port: int
    backends: list[str]
    policy: str
    # True when the key from api_key_file is passed in API_KEY_ENV.
    api_key: bool
    api_key_env: str = API_KEY_ENV

    @property
    def base_url(self) -> str:
        host = DEFAULT_HOST if self.host in ("0.0.0.0", "::") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def router_command(python: str | None = None) -> list[str]:
    """vllm-router's own launcher (its Python parser and the Rust router), through glm53's shim that adds the
    API key from the environment."""
    return [python or sys.executable, "-m", "glm53.router.launcher"]


def build_router_launch(
    fleet: Fleet, *, command: Sequence[str] | None = None, listen_all: bool = False, api_key: bool = False
) -> RouterLaunch:
    """The router's argv for `fleet`. A host other than loopback needs listen_all (the fleet's or the caller's)
    and an API key file."""
    listen_all = listen_all or fleet.listen_all
    check_host(fleet.host, listen_all=listen_all)
    check_host(fleet.metrics.host, listen_all=listen_all)
    if not is_loopback(fleet.host) and fleet.api_key_file is None:
        raise BadInput(
            f"the router would listen on {fleet.host}:{fleet.port} for other machines without an API key",
            fix="set api_key_file in the fleet file (the key the backends are served with, chmod 600)",
        )
    if fleet.port == fleet.metrics.port and fleet.host == fleet.metrics.host:
        raise BadInput(f"port {fleet.port} is both the router's and its metrics' port", fix="set metrics.port")
    urls = [backend.url for backend in fleet.backends]
    limits, health, retry = fleet.limits, fleet.health, fleet.retry
    argv = [
        *(command if command is not None else router_command()),
        "--host", fleet.host,
        "--port", str(fleet.port),
        "--worker-urls", *urls,
        "--policy", fleet.policy,
        # A flood guard (a token bucket in vllm-router 0.1.17); one request per box is each box's max_num_seqs.
        "--max-concurrent-requests", str(limits.max_concurrent_requests),
        "--rate-limit-tokens-per-second", str(limits.max_concurrent_requests),
        "--queue-size", str(limits.queue_size),
        "--queue-timeout-secs", str(limits.queue_timeout_secs),
        "--request-timeout-secs", str(limits.request_timeout_secs),
        "--retry-max-retries", str(retry.max_retries),
        "--retry-initial-backoff-ms", str(retry.initial_backoff_ms),
        "--retry-max-backoff-ms", str(retry.max_backoff_ms),
        "--health-check-interval-secs", str(health.interval_secs),
        "--health-failure-threshold", str(health.failure_threshold),
        "--health-success-threshold", str(health.success_threshold),
        "--health-check-timeout-secs", str(health.timeout_secs),
        "--health-check-endpoint", health.endpoint,
        # At start the router waits for its backends; poll every second, not every 30 s (its default).
        "--worker-startup-check-interval", "1",
        "--prometheus-host", fleet.metrics.host,
        "--prometheus-port", str(fleet.metrics.port),
        "--log-level", fleet.log_level,
    ]  # fmt: skip
    return RouterLaunch(
        argv=argv,
        env={},
        host=fleet.host,
        port=fleet.port,
        backends=urls,
        policy=fleet.policy,
        api_key=api_key,
    )


def router_environment(spec: RouterLaunch, inherited: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """The router's full environment: inherited (without a stale key), the spec's exports, then the key."""
    env = {k: v for k, v in inherited.items() if k != API_KEY_ENV}
    env.update(spec.env)
    if api_key is not None:
        env[API_KEY_ENV] = api_key
    return env


__all__ = ["API_KEY_ENV", "RouterLaunch", "build_router_launch", "router_command", "router_environment"]
