"""The project's one list of Debian packages (data/os-packages.txt), as the README, CI and doctor read it."""

from __future__ import annotations

from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict

OS_PACKAGES_RESOURCE = "data/os-packages.txt"


class OsPackage(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    libraries: tuple[str, ...] = ()  # sonames the engine loads from it


def parse_os_packages(text: str) -> list[OsPackage]:
    packages = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            packages.append(OsPackage(name=fields[0], libraries=tuple(fields[1:])))
    return packages


@cache
def read_os_packages() -> tuple[OsPackage, ...]:
    text = resources.files("glm53").joinpath(OS_PACKAGES_RESOURCE).read_text(encoding="utf-8")
    return tuple(parse_os_packages(text))


def install_command(names: list[str] | None = None) -> str:
    """The apt-get line for `names` (default: the whole list)."""
    wanted = names if names is not None else [p.name for p in read_os_packages()]
    return "apt-get install " + " ".join(wanted)
