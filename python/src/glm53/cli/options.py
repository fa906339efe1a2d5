"""Option aliases shared by every command: one spelling and one help string per concept."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53.fsutil import OUTPUT_POLICY
from glm53.recipe.profiles import PROFILE_NAMES

# Appended to the help of every --out / -o: the one output policy (glm53.fsutil.output_target).
OUT_POLICY = " " + OUTPUT_POLICY

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output file.")]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="Checkpoint lock file (default: MODEL_DIR/checkpoint.lock.json)."),
]
RevisionOpt = Annotated[str, typer.Option("--revision", help="Full 40-hex commit of the Hub repository.")]
# The checkpoint directory, spelled the same in every command that takes one.
ModelDirOpt = Annotated[
    Path | None,
    typer.Option("--model-dir", "-m", help="The checkpoint directory.", show_default=False),
]
RequiredModelDirOpt = Annotated[
    Path, typer.Option("--model-dir", "-m", help="The checkpoint directory.", show_default=False)
]
JobsOpt = Annotated[int | None, typer.Option("--jobs", min=1, help="Files hashed at once (default: CPUs).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Hash every file, ignoring the stat cache.")]
ReproLockOpt = Annotated[Path | None, typer.Option("--lock", help="repro.lock.json to use (default: found).")]
ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help=f"Serving profile: {', '.join(PROFILE_NAMES)}.")]
HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on (not loopback: add --listen-all).")]
PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")]
ListenAllOpt = Annotated[bool, typer.Option("--listen-all", help="Allow a --host other than loopback.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override one profile key (repeatable)."),
]
EnvFileOpt = Annotated[
    Path | None,
    typer.Option("--env-file", help="KEY=VALUE file over the profile (an existing recipe .env works)."),
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option("--api-key-file", help="File holding the API key; passed to vLLM as VLLM_API_KEY, never in argv."),
]
RigOpt = Annotated[
    str | None,
    typer.Option(
        "--rig",
        help="Plan for a described machine instead of this one: a packaged rig (recipe-2x3090, one-3090) or a "
        "JSON file (docs/plan.md).",
    ),
]
PlanEnvOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan-env",
        help="Host plan as KEY=VALUE lines (`glm53 plan --env`); HYBRID_MAIN_CPUS pins vLLM's CPUs.",
    ),
]

# `glm53 bench`: the server measured, and the report written about it.
BaseUrlOpt = Annotated[
    str,
    typer.Option("--base-url", envvar="GLM53_BASE_URL", help="The server's URL (OpenAI-compatible vLLM)."),
]
ServedModelOpt = Annotated[
    str | None, typer.Option("--model", help="Served model name (default: the first in /v1/models).")
]
ReportDirOpt = Annotated[
    Path,
    typer.Option("--out", help="Report directory: summary.json (+ plots) are written or updated there." + OUT_POLICY),
]
RequestTimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1.0, help="Seconds without data before a request is given up.")
]
ServeProfileOpt = Annotated[
    str | None,
    typer.Option("--serve-profile", help="Record this serving profile's resolved settings as the plan in force."),
]
# The same --env-file as serve's, seen from the benchmark: it is recorded, not applied.
ServedEnvFileOpt = Annotated[
    Path | None,
    typer.Option("--env-file", help="The .env file the server was started with (recorded in the plan)."),
]
BackendOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--backend",
        metavar="URL",
        help="A server behind the router at --base-url (repeatable): the report adds each one's share of the "
        "requests and tokens and its prefix-cache hit rate, from its own /metrics.",
        show_default=False,
    ),
]
ReportOnlyOpt = Annotated[bool, typer.Option("--report-only", help="Report failing gates without exiting non-zero.")]

# `glm53 systemd-unit`: the glm53 command the unit runs, and where the unit is written.
Glm53PathOpt = Annotated[
    Path | None,
    typer.Option(
        "--glm53",
        help="The glm53 executable the unit runs (default: the one on PATH); vLLM is taken from its directory.",
        show_default=False,
    ),
]
UnitOutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Write the unit to this file instead of stdout." + OUT_POLICY, show_default=False),
]
# `glm53 bench`'s key: a file or the environment keep it out of argv (/proc/PID/cmdline shows argv to every user).
BenchApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="Bearer token, when the server wants one. Visible to every user of this host (in the process list): "
        "prefer --api-key-file or GLM53_API_KEY / OPENAI_API_KEY.",
        show_default=False,
    ),
]
BenchApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-key-file",
        help="File holding the bearer token on its first line (not readable by every user: chmod 600).",
        show_default=False,
    ),
]

# `glm53 router`: the fleet file, and the probe of its backends before the start.
FleetFileArg = Annotated[
    Path,
    typer.Argument(
        help="Fleet file (TOML or JSON): backends, policy, limits (see docs/router.md).", show_default=False
    ),
]
SkipProbeOpt = Annotated[
    bool,
    typer.Option("--skip-probe", help="Start without checking that every backend answers /health first."),
]
RouterApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-key-file",
        help="The fleet's API key file (over the fleet file's api_key_file); given to the router in its "
        "environment, never in argv.",
        show_default=False,
    ),
]
