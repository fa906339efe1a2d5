"""glm53: serve GLM-5.3-Flash (EXL3) reproducibly on consumer GPUs with CPU expert offload."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path


def _version() -> str:
    """The installed distribution's version; from a source tree that is not installed, python/pyproject.toml's
    (the one place the version is written; the Nix package reads it there too)."""
    try:
        return metadata.version("glm53")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


def __getattr__(name: str) -> str:
    # Read on first use: `import glm53` (every command) does not look the distribution up.
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'glm53' has no attribute {name!r}")
