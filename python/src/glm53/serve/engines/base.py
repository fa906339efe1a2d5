"""The seam every engine implements (`ServeEngine`): what it plans on a host, how its launch is built from a
profile, checked before a start and shown in a dry run, and how it is started. Nothing outside an engine's own
module asks which engine a launch runs: it asks the launch's `ServeEngine`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from glm53.output import Output
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile
from glm53.serve.exec import EngineProcess
from glm53.serve.launch import FlagCheck, LaunchSpec, PlanInput
from glm53.serve.progress import StageMarker

# A host plan as profile values (key, value, origin) plus what it sets beside the profile keys.
PlanLayer = tuple[list[tuple[str, str, str]], PlanInput]
PLAN_THIS_HOST = "plan (this host)"


@dataclass(frozen=True)
class LaunchInputs:
    """What a launch is built from besides its profile, as the request resolved it."""

    model_dir: Path | str
    host: str
    port: int
    listen_all: bool
    plan: PlanInput | None
    api_key: bool
    environ: Mapping[str, str]
    # Planned on the serving host (serve and its dry run), not a build-time check of another machine.
    plan_here: bool
    capture_routing: Path | None


class ServeEngine(Protocol):
    name: Engine
    # The keys a host plan sets: what a dry run names when this host cannot be planned.
    planned_keys: tuple[str, ...]
    # `--rig`: the engine's planner can plan a described machine; `--capture-routing`: it records routing.
    plans_rigs: bool
    captures_routing: bool
    # The serving-shape fields `glm53 plan host` passes its planner; None: every field and the host's resources
    # (--ram, --cpus, --bandwidth).
    plan_shape_fields: tuple[str, ...] | None
    # The stages of a start its log shows, in order (`glm53.serve.progress`).
    start_stages: tuple[StageMarker, ...]

    def check_model_dir(self, model_dir: Path) -> None:
        """Refuse a checkpoint this engine cannot serve (BadInput), before anything is planned."""

    def plan_here(self, profile: Profile, model_dir: Path | None, *, root: Path, rig: str | None) -> PlanLayer:
        """Plan this host (under `root`) or the rig named; Unavailable when there is nothing to plan on."""
        ...

    def build(self, profile: Profile, given: LaunchInputs) -> LaunchSpec:
        """The argv, environment, files and CPU affinity a start execs."""
        ...

    def check(self, spec: LaunchSpec) -> FlagCheck:
        """The engine's own check of the launch (its flag parser or config schema), for a dry run."""
        ...

    def check_line(self, check: FlagCheck) -> str:
        """That check as a dry run's last line."""
        ...

    def api_key_lines(self, spec: LaunchSpec) -> tuple[str | None, str | None]:
        """Where the API key goes, as a dry run shows it without the key: (an environment line, a file's path)."""
        ...

    def before_preflight(self, spec: LaunchSpec) -> None:
        """What a start checks before the doctor's checks (the engine's native libraries)."""

    def before_exec(self, spec: LaunchSpec, out: Output, *, skip_flag_check: bool) -> None:
        """What a start checks last, after the host plan: the launch against the engine's own parser or schema."""

    def prepare(self, spec: LaunchSpec, *, api_key: str | None, inherited: Mapping[str, str]) -> EngineProcess:
        """What a start runs (the program found on the launch's PATH), after writing the files it reads;
        Unavailable when the program or its tree is missing."""
        ...
