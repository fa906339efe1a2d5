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
        # In Annotated[..., typer.Option("--x", "-x")], Typer keeps the first declaration as the default.
        decls = [getattr(meta, "default", None), *(getattr(meta, "param_decls", ()) or ())]
        long = [d for d in decls if isinstance(d, str) and d.startswith("--")]
        if long:
            return long[0]
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
    """Wrap every command of `app` (and of its sub-apps, and their callbacks: `glm53 plan` is one) so that its
    path arguments are checked first."""
    infos: list[Any] = [*app.registered_commands]
    if app.registered_callback is not None:
        infos.append(app.registered_callback)
    for info in infos:
        if callable(info.callback) and not getattr(info.callback, "_paths_checked", False):
            info.callback = _checked(info.callback)
            info.callback._paths_checked = True
    for group in app.registered_groups:
        if isinstance(group.typer_instance, typer.Typer):
            check_path_arguments(group.typer_instance)
