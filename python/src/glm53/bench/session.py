"""A measuring session, shared by `bench run`, `needle`, `coherence` and `agent`: connect to the server,
check that a report can be written and record the environment before anything is measured, and shape the
gated result that each command prints."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.bench.backends import BackendMetrics, SplitTracker
from glm53.bench.client import BenchClient, ServerInfo
from glm53.bench.gates import GateResult
from glm53.bench.report import (
    Environment,
    collect_environment,
    ensure_same_server,
    json_safe,
    prepare_out_dir,
    write_section,
)
from glm53.bench.target import Target
from glm53.errors import BadInput, Glm53Error
from glm53.recipe.profiles import PROFILE_NAMES
from glm53.serve.exec import read_api_key

# Where the API key may come from besides --api-key-file and --api-key, in this order.
API_KEY_ENV = ("GLM53_API_KEY", "OPENAI_API_KEY")


@dataclass(frozen=True)
class Session:
    client: BenchClient
    server: ServerInfo
    environment: Environment
    tracker: SplitTracker | None = None  # the per-backend split, when --backend lists the router's backends


@contextmanager
def measuring(target: Target) -> Iterator[Session]:
    """Connect, and yield the client, the server and the environment recorded for the report (and, with
    backends, the per-backend split, already started); the client is closed on leaving."""
    client, server = _connect(target)
    with client:
        # Before measuring, so that a bad --profile, --env-file or --out fails in seconds, not after
        # an hour of measurement.
        environment = _environment(server, target)
        if not target.backends:
            yield Session(client, server, environment)
            return
        source = BackendMetrics(target.backends, api_key=target.api_key, timeout_s=min(target.timeout_s, 30.0))
        try:
            source.check()  # every backend's counters readable, or exit 3 before anything is measured
            # The engine's counters of a request are the backends' (the router has none of its own).
            client.metrics_source = source.metrics_text
            tracker = SplitTracker(source)
            tracker.start()  # the split counts from here: every request of the session is after it
            yield Session(client, server, environment, tracker)
        finally:
            source.close()


def _connect(target: Target) -> tuple[BenchClient, ServerInfo]:
    if not math.isfinite(target.timeout_s):
        raise BadInput(f"--timeout {target.timeout_s}: not a finite number of seconds", fix="e.g. --timeout 1800")
    client = BenchClient(target.base_url, timeout_s=target.timeout_s, api_key=target.api_key)
    try:
        return client, client.server_info(target.model)
    except Exception:
        client.close()
        raise


def _environment(server: ServerInfo, target: Target) -> Environment:
    profile = target.serve_profile
    if profile is not None and profile not in PROFILE_NAMES:
        raise BadInput(
            f"--profile {profile!r} is not a known profile",
            fix=f"use one of: {', '.join(PROFILE_NAMES)}",
        )
    prepare_out_dir(target.out_dir)
    ensure_same_server(target.out_dir, server)
    return collect_environment(server, profile=profile, env_file=target.env_file)


def gated_payload(payload: dict[str, Any], gates: list[GateResult]) -> dict[str, Any]:
    """A command's `--json` result: its payload and the gates evaluated. As in summary.json, a NaN or an
    infinity becomes null, since JSON has neither (and `non_finite` says which)."""
    return json_safe({**payload, "gates": [gate.model_dump(mode="json") for gate in gates]})


def resolve_api_key(flag: str | None, key_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token: --api-key-file (read as `glm53 serve` reads it: bounded, refused when readable by
    every user), else --api-key, else GLM53_API_KEY, else OPENAI_API_KEY; None when none is set."""
    if key_file is not None and flag is not None:
        raise BadInput("pass --api-key-file or --api-key, not both", fix="prefer --api-key-file")
    if key_file is not None:
        return read_api_key(key_file)
    if flag is not None:
        if not flag.strip():
            raise BadInput("--api-key is empty", fix="pass the key in --api-key-file, or leave it out")
        return flag
    env = os.environ if environ is None else environ
    for name in API_KEY_ENV:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def check_answer_fits(max_tokens: int, max_model_len: int | None, *, prompt_allowance: int, flag: str) -> None:
    """An answer budget the server's context cannot hold fails every request with HTTP 400: refuse it first."""
    if max_model_len is not None and max_tokens + prompt_allowance > max_model_len:
        room = max_model_len - prompt_allowance
        raise BadInput(
            f"{flag} {max_tokens} does not fit the server's max_model_len {max_model_len} "
            f"(with up to {prompt_allowance} tokens of prompt)",
            fix=f"pass {flag} {room} or less" if room > 0 else "serve with a larger MAX_MODEL_LEN",
        )


def checkpointer(
    out_dir: Path, environment: Environment, section: str, warn: Callable[[str], None]
) -> Callable[[Any], None]:
    """A callback writing a section so far (`complete` False) to summary.json after every request, so that a
    crash, Ctrl-C or SIGTERM hours in loses nothing measured. A write that fails is a warning (once): the
    measurement goes on, and the final write reports the failure."""
    failed = False

    def write(partial: Any) -> None:
        nonlocal failed
        try:
            write_section(out_dir, environment, **{section: partial}, gates={section: []})
        except Glm53Error as exc:
            if not failed:
                warn(f"the report could not be updated after this request: {exc.message}")
            failed = True

    return write


__all__ = [
    "API_KEY_ENV",
    "Session",
    "Target",
    "check_answer_fits",
    "checkpointer",
    "gated_payload",
    "measuring",
    "resolve_api_key",
]
