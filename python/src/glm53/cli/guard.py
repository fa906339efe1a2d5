"""Every path a command takes is checked before the command runs: a name longer than the file system allows
(255 bytes) or a path longer than the kernel takes (4096) is a clear error (exit 2) naming the option, not a
traceback from whichever call first touches it. What kind of file a path must be is checked where it is read
or written (glm53.fsutil)."""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import typer

from glm53.fsutil import check_path


def _flag(hints: dict[str, Any], name: str) -> str:
    for meta in getattr(hints.get(name), "__metadata__", ()):
        decls = [d for d in getattr(meta, "param_decls", ()) or () if d.startswith("--")]
        if decls:
            return str(decls[0])
    return name.upper()


def _checked(function: Callable[..., Any]) -> Callable[..., Any]:
    hints = typing.get_type_hints(function, include_extras=True)

    @functools.wraps(function)
    def command(*args: Any, **kwargs: Any) -> Any:
        for name, value in kwargs.items():
            for item in value if isinstance(value, list | tuple) else (value,):
                if isinstance(item, PurePath):
                    check_path(item, what=_flag(hints, name))
        return function(*args, **kwargs)

    return command


def check_path_arguments(app: typer.Typer) -> None:
    """Wrap every command of `app` (and of its sub-apps) so that its path arguments are checked first."""
    for info in app.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_paths_checked", False):
            info.callback = _checked(info.callback)
            info.callback._paths_checked = True  # type: ignore[attr-defined]
    for group in app.registered_groups:
        if group.typer_instance is not None:
            check_path_arguments(group.typer_instance)
