"""The Typer classes every glm53 command is built with, so that each `--help` reads the same way.

- A help paragraph is one line of prose however the docstring wraps it: rich then wraps it at the terminal's
  width, at word boundaries, instead of keeping the docstring's line ends (which broke lines mid-sentence at
  100 columns). A paragraph whose lines are commands (an `Example:` section, indented lines) keeps its lines.
- Help text is literal: `[recipe: 2]` is shown, not read as rich markup.
- A flag shows no `<bool>` type; a usage line names its arguments (`glm53 router FLEET_FILE`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

F = TypeVar("F", bound=Callable[..., Any])

# A paragraph that opens with one of these, or has an indented line, lists commands: its lines are kept.
_VERBATIM_OPENERS = ("Example:", "Examples:", "\b")


def reflow(text: str | None) -> str | None:
    """Each prose paragraph of a docstring on one line; example paragraphs as written; markup escaped."""
    if text is None:
        return None
    paragraphs = []
    for index, paragraph in enumerate(inspect.cleandoc(text).split("\n\n")):
        lines = paragraph.split("\n")
        verbatim = paragraph.startswith(_VERBATIM_OPENERS) or any(line.startswith(" ") for line in lines[1:])
        if verbatim and index == 1:
            # Typer dedents the text after the first paragraph (inspect.cleandoc, which measures the margin
            # from its second line on): a leading blank line keeps an example list that comes first indented.
            paragraph = "\n" + paragraph
        paragraphs.append(paragraph if verbatim else " ".join(line.strip() for line in lines))
    return escape("\n\n".join(paragraphs))


def _plain_params(command: Any) -> None:
    for param in command.params:
        if getattr(param, "help", None):
            param.help = escape(param.help)


def _hide_flag_types(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # the help panel shows the metavar as the type: nothing, for an on/off flag
    return params


if TYPE_CHECKING:
    _Click = TyperCommand  # what _Readable is mixed into: Typer's command or group
else:
    _Click = object


class _Readable(_Click):
    """What a command and a group both do: their help reflowed and literal, their flags shown without a type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)
        _plain_params(self)

    def get_params(self, ctx: Any) -> list[Any]:
        return _hide_flag_types(super().get_params(ctx))


class Command(_Readable, TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # Typer writes a required argument as `{name}`; the usage line names it as its help does.
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or param.name.upper()
                pieces.append(name if param.required else f"[{name}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class Group(_Readable, TyperGroup):
    pass


class App(typer.Typer):
    """typer.Typer whose groups and commands are the classes above."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("pretty_exceptions_enable", False)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
        kwargs.setdefault("cls", Command)
        decorate: Callable[[F], F] = super().command(name, **kwargs)
        return decorate


__all__ = ["App", "Command", "Group", "reflow"]
