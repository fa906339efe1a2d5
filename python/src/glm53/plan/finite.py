"""Strict JSON out: every plan, report and probe file written or printed holds finite numbers only.

Python's json writes NaN and Infinity as bare words no JSON parser accepts; inputs are validated so that none
arises, and this is the last check before anything leaves, naming the field instead of writing a broken file.
"""

from __future__ import annotations

import math
from typing import Any

from glm53.errors import CheckFailed


def _non_finite(value: Any, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _non_finite(item, f"{where}.{index}" if where else str(index))
            if found is not None:
                return found
    return None


def require_finite(value: Any, *, what: str) -> Any:
    """`value` unchanged when every number in it is finite; else CheckFailed naming the first field that is not."""
    where = _non_finite(value, "")
    if where is not None:
        raise CheckFailed(
            f"{what}: {where or 'the value'} is not a finite number, which JSON cannot hold; nothing was written",
            fix="an input was out of range: check the files and flags given (e.g. the --bandwidth report)",
        )
    return value


__all__ = ["require_finite"]
