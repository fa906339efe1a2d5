"""The preflight part of the engine seam (`PreflightEngine`): what a profile of the engine asks of the host, what
of the engine's installation is read, and the engine's own checks. The doctor's checks ask the engine's
`PreflightEngine`; nothing in them asks which engine it is."""

from __future__ import annotations

from typing import Protocol

from glm53.host.exl3_engine import Exl3EngineFacts
from glm53.preflight.models import DoctorFacts, DoctorFinding, HostLimits, Requirements
from glm53.recipe.engine import Engine
from glm53.recipe.profiles import Profile


class PreflightEngine(Protocol):
    name: Engine
    # Whether the shared libraries vLLM and torch link are this engine's (read with the host's facts).
    reads_engine_libraries: bool
    # Whether the engine runs as a container image (a runtime and CDI are part of its host audit).
    runs_in_container: bool

    def requirements(self, profile: Profile) -> Requirements:
        """What a profile of this engine asks of the host: GPUs, pinned memory, RAM."""
        ...

    def read_engine(self) -> Exl3EngineFacts | None:
        """The engine's installation, where the doctor reads it (I/O)."""
        ...

    def checks(self, facts: DoctorFacts, need: Requirements, limits: HostLimits) -> list[DoctorFinding]:
        """The engine's own checks of the host."""
        ...

    def gpu_count_fix(self, found: int, limits: HostLimits) -> str:
        """The fix when the host has another number of GPUs than the profile asks."""
        ...
