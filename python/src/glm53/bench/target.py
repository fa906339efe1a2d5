"""The server a bench command measures and what its report records about it: the options `bench run`,
`needle`, `coherence` and `agent` share. Light on purpose (pydantic only): the CLI builds its options from
it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from glm53.constants import DEFAULT_BASE_URL
from glm53.fsutil import OUTPUT_POLICY

DEFAULT_REPORT_DIR = Path("glm53-bench")


class Target(BaseModel):
    model_config = ConfigDict(frozen=True)

    base_url: str = Field(DEFAULT_BASE_URL, description="The server's URL (OpenAI-compatible vLLM).")
    model: str | None = Field(None, description="Served model name (default: the first in /v1/models).")
    out_dir: Path = Field(
        DEFAULT_REPORT_DIR,
        description="Report directory: summary.json (+ plots) are written or updated there. " + OUTPUT_POLICY,
    )
    timeout_s: float = Field(1800.0, ge=1.0, description="Seconds without data before a request is given up.")
    serve_profile: str | None = Field(
        None,
        description="The serving profile the measured server runs: its resolved settings are recorded as the plan "
        "in force.",
    )
    env_file: Path | None = Field(None, description="The .env file the server was started with (recorded in the plan).")
    # Checked URLs (glm53.bench.backends.parse_backends).
    backends: tuple[str, ...] = Field(
        (),
        description="A server behind the router at --base-url (repeatable): the report adds each one's share of "
        "the requests and tokens and its prefix-cache hit rate, from its own /metrics.",
    )
    # Resolved from a key file, a flag or the environment (glm53.bench.session.resolve_api_key).
    api_key: str | None = Field(None, repr=False, description="Bearer token, when the server wants one.")


__all__ = ["DEFAULT_REPORT_DIR", "Target"]
