"""Memory sizes as people write them ('24GiB', '24G', '24GB', plain bytes)."""

from __future__ import annotations

import re
from decimal import Decimal

from glm53.errors import BadInput

_SIZE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
# No memory is larger than this (8 EiB): a bigger figure is a typo, and would overflow the arithmetic after.
MAX_SIZE = (1 << 63) - 1
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "KB": 10**3,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "MB": 10**6,
    "G": 1 << 30,
    "GIB": 1 << 30,
    "GB": 10**9,
    "T": 1 << 40,
    "TIB": 1 << 40,
    "TB": 10**12,
}


def parse_size(text: str, *, flag: str, positive: bool = False) -> int:
    """'24GiB', '24G' (binary), '24GB' (decimal) or plain bytes; with `positive`, zero is refused too."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else ""
    if match is None or unit not in _UNITS:
        raise BadInput(f"{flag}: {text[:40]!r} is not a size", fix="write e.g. 24GiB, 24576MiB or 25769803776")
    size = int(Decimal(match.group(1)) * _UNITS[unit])
    if size > MAX_SIZE:
        raise BadInput(f"{flag}: {text!r} is larger than any memory ({MAX_SIZE:,} bytes at most)")
    if positive and size <= 0:
        raise BadInput(f"{flag}: {text!r} is no memory at all", fix="give a size above zero, e.g. 24GiB")
    return size


__all__ = ["parse_size"]
