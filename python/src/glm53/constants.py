"""Values written once and read everywhere: the server's default address and the binary size units."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def format_gib(size: float) -> str:
    """A size as plans and their tables show it: 23.16 GiB (1,024.00 GiB past a thousand)."""
    return f"{size / GIB:,.2f} GiB"


# Where `glm53 serve` listens, and so where `glm53 bench` looks, unless told otherwise: loopback only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_BASE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_HOST", "DEFAULT_PORT", "GIB", "KIB", "MIB", "format_gib"]
