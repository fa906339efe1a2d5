"""Options shared by the commands: one spelling and one help string per concept.

The surface's rules (tests/test_cli_surface.py holds every command to those a test can check):

- A positional argument is the file or repository the command acts on: `bench compare A [B]`, `repro diff A
  [B]`, `router FLEET_FILE`, `plan simulate TRACE`, `repro check [REPO]`; a Hub repository is one too, as `hf
  download` takes it (`model download turboderp/GLM-5.3-Flash-exl3`, `model lock REPO`).
- `--model-dir` is the checkpoint directory, always an option, never shortened (`-m` would read as `--model`).
- `--model` is the served model's name (the OpenAI "model" field), in `bench`.
- `--profile`/`-p` is a serving profile (data/profiles): the one to serve, check or plan for, or, in `bench`,
  the one the measured server runs. The recipe's published figures are picked with `--figures`.
- `--host-root` reads /proc, /sys and /dev/shm under another root (a container's or a saved tree).
- `--out` is where a command writes its result: a file, or a directory for a command that writes several
  (`plan host`, `bench`). `--plots-dir` is where a command writes plots; `bench run --plots/--no-plots` says
  whether it draws them at all (into its `--out`).
- `--force` replaces an existing output file; without it the command refuses before doing any work. A bench
  report directory is added to, a section at a time, not replaced. `--yes` answers a confirmation instead
  (`repro resolve` edits repro.lock.json in place after showing the diff).
- `--lock` is repro.lock.json, where a command reads it in place of the one it finds (`repro`);
  `--checkpoint-lock` is a checkpoint's lock in place of MODEL_DIR/checkpoint.lock.json (`model`). One flag,
  one kind of file.
- `--json` prints the result on stdout as JSON: the result model's own dump.
- Every leaf command's help ends with an `Examples:` section of command lines that run as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from glm53.errors import BadInput
from glm53.fsutil import OUTPUT_POLICY
from glm53.recipe.profiles import PROFILE_NAMES
from glm53.router.capacity import FiguresProfile

if TYPE_CHECKING:
    ProfileName = str
else:
    # The packaged profiles as choices: a data file added to data/profiles is a new choice.
    ProfileName = Literal[PROFILE_NAMES]

# Appended to the help of every --out / -o: the one output policy (glm53.fsutil.output_target).
OUT_POLICY = " " + OUTPUT_POLICY

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output file.")]


def refuse_to_replace(paths: Iterable[Path], *, force: bool) -> None:
    """The one overwrite policy: an output file that exists is replaced only with --force (checked before
    any work, so that a refusal costs nothing)."""
    if force:
        return
    for path in paths:
        if path.exists() and not path.is_dir():
            raise BadInput(f"{path} already exists", fix="pass --force to replace it")


CheckpointLockOpt = Annotated[
    Path | None,
    typer.Option("--checkpoint-lock", help="Checkpoint lock file (default: MODEL_DIR/checkpoint.lock.json)."),
]
RevisionOpt = Annotated[str, typer.Option("--revision", help="Full 40-hex commit of the Hub repository.")]
# The checkpoint directory, spelled the same in every command that takes one.
ModelDirOpt = Annotated[Path | None, typer.Option("--model-dir", help="The checkpoint directory.", show_default=False)]
RequiredModelDirOpt = Annotated[Path, typer.Option("--model-dir", help="The checkpoint directory.", show_default=False)]
JobsOpt = Annotated[int | None, typer.Option("--jobs", min=1, help="Files hashed at once (default: CPUs).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Hash every file, ignoring the stat cache.")]
ReproLockOpt = Annotated[Path | None, typer.Option("--lock", help="repro.lock.json to use (default: found).")]
_PROFILE_HELP = f"Serving profile: {', '.join(PROFILE_NAMES)}."
ProfileOpt = Annotated[ProfileName, typer.Option("--profile", "-p", metavar="NAME", help=_PROFILE_HELP)]
# A profile that only some invocations name: what its absence means is said in each command's help.
OptionalProfileOpt = Annotated[
    ProfileName | None, typer.Option("--profile", "-p", metavar="NAME", help=_PROFILE_HELP, show_default=False)
]
HostRootOpt = Annotated[
    Path,
    typer.Option("--host-root", help="Read /proc, /sys and /dev/shm under this root (a container's or a saved tree)."),
]
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
        help="Host plan as KEY=VALUE lines (`glm53 plan host --env`); HYBRID_MAIN_CPUS pins vLLM's CPUs.",
    ),
]

# `glm53 bench`: its options come from glm53.bench.target.Target (the server) and glm53.bench.settings (what each
# command measures and gates), in cli/bench.py; the key and --json are the rest.
# The recipe's published figures (data/recipe-performance.json), picked by the profile they were measured with.
FiguresOpt = Annotated[
    FiguresProfile | None,
    typer.Option(
        "--figures",
        help="The recipe's figures to compare with: those measured with this profile (default: the recipe's "
        "default profile).",
        show_default=False,
    ),
]

# `glm53 systemd-unit`: the glm53 command the unit runs, and where the unit is written.
Glm53PathOpt = Annotated[
    Path | None,
    typer.Option(
        "--glm53",
        help="The glm53 executable the unit runs (default: this one); vLLM is taken from its directory.",
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
        metavar="FLEET_FILE",
        help="Fleet file (TOML or JSON): backends, policy, limits (see docs/router.md).",
        show_default=False,
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
