"""The Nix configuration the tests need, set by the tests rather than taken from how the host set Nix up."""

from __future__ import annotations

import os

# Root without a daemon builds as itself (Debian's nix-bin creates the nixbld group only through a Recommends);
# no substituters (offline), no sandbox (the settings check runs the venv's glm53).
NIX_CONFIG = "experimental-features = nix-command flakes\nsubstituters =\nsandbox = false" + (
    "\nbuild-users-group =" if os.geteuid() == 0 else ""
)
NIX_ENV = {**os.environ, "NIX_CONFIG": NIX_CONFIG}

__all__ = ["NIX_CONFIG", "NIX_ENV"]
