"""A measuring session, shared by `bench run`, `needle`, `coherence` and `agent`: connect to the server,
check that a report can be written and record the environment before anything is measured, and shape the
gated result that each command prints."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.bench.client import BenchClient, ServerInfo
from glm53.bench.gates import GateResult
from glm53.bench.report import (
    Environment,
    collect_environment,
    ensure_same_server,
    finite_or_none,
    prepare_out_dir,
)
from glm53.errors import BadInput


@dataclass(frozen=True)
class Target:
    """The server to measure and what the report records about it (the bench commands' shared options)."""

    base_url: str
    model: str | None
    timeout_s: float
    api_key: str | None
    serve_profile: str | None
    env_file: Path | None
    out_dir: Path


@dataclass(frozen=True)
class Session:
    client: BenchClient
    server: ServerInfo
    environment: Environment


@contextmanager
def measuring(target: Target) -> Iterator[Session]:
    """Connect, and yield the client, the server and the environment recorded for the report; the client
    is closed on leaving."""
    client, server = _connect(target)
    with client:
        # Before measuring, so that a bad --serve-profile, --env-file or --out fails in seconds, not after
        # an hour of measurement.
        yield Session(client, server, _environment(server, target))


def _connect(target: Target) -> tuple[BenchClient, ServerInfo]:
    if not math.isfinite(target.timeout_s):
        raise BadInput(f"--timeout {target.timeout_s}: not a finite number of seconds", hint="e.g. --timeout 1800")
    client = BenchClient(target.base_url, timeout_s=target.timeout_s, api_key=target.api_key)
    try:
        return client, client.server_info(target.model)
    except Exception:
        client.close()
        raise


def _environment(server: ServerInfo, target: Target) -> Environment:
    from glm53.serve.profiles import PROFILE_NAMES

    profile = target.serve_profile
    if profile is not None and profile not in PROFILE_NAMES:
        raise BadInput(
            f"--serve-profile {profile!r} is not a known profile",
            hint=f"use one of: {', '.join(PROFILE_NAMES)}",
        )
    prepare_out_dir(target.out_dir)
    ensure_same_server(target.out_dir, server)
    return collect_environment(server, profile=profile, env_file=target.env_file)


def gated_payload(payload: dict[str, Any], gates: list[GateResult]) -> dict[str, Any]:
    """A command's `--json` result: its payload and the gates evaluated. As in summary.json, a NaN or an
    infinity becomes null, since JSON has neither."""
    cleaned: dict[str, Any] = finite_or_none({**payload, "gates": [gate.model_dump(mode="json") for gate in gates]})
    return cleaned


__all__ = ["Session", "Target", "gated_payload", "measuring"]
