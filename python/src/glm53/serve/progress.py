"""The stages of a start, each reported once with its time: what `glm53 serve` says while an engine loads.

glm53's own stages (plan, config, engine started) are timed where they happen. The engine's stages are read
from its log as it writes it: each engine names its stages as markers (`StageMarker`), a line its own code
prints when the stage is done, and `StageWatcher` reports each the first time it appears, in the order seen.
The last stage, first health, is the first 200 from GET /health. Pure: the clock and the lines come in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = "glm53 start:"
FIRST_HEALTH = "first health"


@dataclass(frozen=True)
class StageMarker:
    """A stage an engine's log shows: `pattern` is searched in each line; `detail` says what is now done."""

    stage: str
    pattern: re.Pattern[str]
    detail: str


@dataclass(frozen=True)
class StageReached:
    stage: str
    seconds: float
    detail: str

    def line(self) -> str:
        return stage_line(self.stage, self.seconds, self.detail)


def stage_line(stage: str, seconds: float, detail: str) -> str:
    """One line a start prints for a stage: `glm53 start: 12.3 s  engine load: ...`."""
    return f"{PREFIX} {seconds:7.1f} s  {stage}: {detail}"


LINE_PATTERN = re.compile(rf"^{re.escape(PREFIX)}\s+(?P<seconds>\d+\.\d) s  (?P<stage>[^:]+): (?P<detail>.*)$")


def parse_stage_line(line: str) -> StageReached | None:
    """A stage line back as data (what a test or a supervisor of glm53 reads), None for any other line."""
    found = LINE_PATTERN.match(line.rstrip("\r\n"))
    if found is None:
        return None
    return StageReached(found["stage"], float(found["seconds"]), found["detail"])


@dataclass
class StageWatcher:
    """Feeds the engine's output through the markers; each marker fires once. Output arrives in chunks that
    may split a line, and progress bars end their lines with a carriage return: both are handled here."""

    markers: tuple[StageMarker, ...]
    reached: list[StageReached] = field(default_factory=list)
    _pending: str = ""
    _fired: set[str] = field(default_factory=set)

    def feed(self, chunk: str, seconds: float) -> list[StageReached]:
        """The stages this chunk completes, at `seconds` since the start."""
        text = self._pending + chunk
        *lines, self._pending = re.split(r"[\r\n]", text)
        if len(self._pending) > 65536:  # a line without an end is still searched, and not kept growing
            lines.append(self._pending)
            self._pending = ""
        return [stage for line in lines for stage in self._match(line, seconds)]

    def finish(self, seconds: float) -> list[StageReached]:
        """At the end of the output: a last line without its newline."""
        line, self._pending = self._pending, ""
        return self._match(line, seconds) if line else []

    def _match(self, line: str, seconds: float) -> list[StageReached]:
        found = []
        for marker in self.markers:
            if marker.stage not in self._fired and marker.pattern.search(line):
                self._fired.add(marker.stage)
                stage = StageReached(marker.stage, seconds, marker.detail)
                self.reached.append(stage)
                found.append(stage)
        return found


__all__ = [
    "FIRST_HEALTH",
    "PREFIX",
    "StageMarker",
    "StageReached",
    "StageWatcher",
    "parse_stage_line",
    "stage_line",
]
