"""Command-line options made from a pydantic model's fields: a default, a description and a bound are written
once, on the model, and `--help` shows them.

    @fleet_app.command("plan")
    @options_from(PlanInputs, "inputs", flags={"profile": Flag("--figures")})
    def plan_cmd(inputs: PlanInputs, json_out: JsonOpt = False) -> None: ...

The parameter `inputs` becomes one option per field: the field's default, its description as the help,
ge/le (and gt/lt on integers) as the option's range, a Literal as its choices. The command gets the model
built from the options; with `given_only`, the values given on the command line alone (for a library
function that lays them over a profile's). A value the model refuses becomes BadInput naming the flag that
gave it: `flag_error` is the one translator from a validation error to a flag.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from glm53.errors import BadInput, invalid_document

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line, where it differs from what the field says."""

    name: str | None = None  # the option, e.g. "--tp" (default: --field-name)
    aliases: tuple[str, ...] = ()  # more names for it, e.g. ("-p",)
    help: str | None = None  # instead of the field's description
    type: Any = None  # the option's type, where the field's is not what is typed (a size as "24GiB")
    parse: Callable[[Any], Any] | None = None  # the option's value -> the field's
    show: Callable[[Any], Any] | None = None  # the field's default -> the option's (e.g. (3, ..., 44) -> "3-44")
    default_text: str | None = None  # with given_only: what an absent option leaves, when not given_only's text
    metavar: str | None = None
    envvar: str | None = None
    hidden: bool = False


def flag_name(field: str, flags: Mapping[str, Flag] | None = None) -> str:
    spec = (flags or {}).get(field)
    return spec.name if spec is not None and spec.name else "--" + field.replace("_", "-")


def flag_error(
    exc: ValidationError,
    flags: Mapping[str, str],
    *,
    given: Sequence[str] | None = None,
    source: str = "the command line",
    fix: str | None = None,
) -> BadInput:
    """The first error of `exc` as BadInput: `--flag VALUE: why` when a flag gave the field (every field in
    `flags`, or those in `given` when given), else `SOURCE: field: why` (a value from a file or profile)."""
    first = exc.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    if field in flags and (given is None or field in given):
        return BadInput(f"{flags[field]} {first.get('input')!r}: {first['msg']}", fix=fix)
    return invalid_document(exc, source, fix=fix)


@contextmanager
def flags_of(
    flags: Mapping[str, str], *, given: Sequence[str] | None = None, source: str = "the command line", fix: str
) -> Iterator[None]:
    """Inside: a ValidationError leaves as BadInput naming the flag (flag_error)."""
    try:
        yield
    except ValidationError as exc:
        raise flag_error(exc, flags, given=given, source=source, fix=fix) from exc


def _optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(args) < len(get_args(annotation)):
            return args[0], True
    return annotation, False


def _option_type(annotation: Any) -> Any:
    # A tuple field takes the option once per value (typer repeats a list option).
    if get_origin(annotation) is tuple and len(get_args(annotation)) == 2 and get_args(annotation)[1] is Ellipsis:
        return list[get_args(annotation)[0]]  # type: ignore[misc]
    return annotation


def _bounds(info: FieldInfo, base: Any) -> dict[str, Any]:
    """ge/le as the option's min/max; gt/lt too on integers (x > 0 is x >= 1). A float's open bound is left
    to the model: the option cannot say it, the model's error names the flag."""
    bounds: dict[str, Any] = {}
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["min"] = item.ge
        elif isinstance(item, annotated_types.Le):
            bounds["max"] = item.le
        elif isinstance(item, annotated_types.Gt) and base is int:
            bounds["min"] = item.gt + 1  # type: ignore[operator]
        elif isinstance(item, annotated_types.Lt) and base is int:
            bounds["max"] = item.lt - 1  # type: ignore[operator]
    return bounds if base in (int, float) else {}


def _help(info: FieldInfo, spec: Flag, field: str) -> str:
    text = spec.help or info.description
    if not text:
        raise TypeError(f"{field} has no description: give it Field(description=...) or Flag(help=...)")
    return text


@dataclass(frozen=True)
class _Option:
    field: str
    param: str  # the keyword the generated option passes
    flag: str
    spec: Flag


def _parameters(
    model: type[BaseModel], prefix: str, fields: Sequence[str], flags: Mapping[str, Flag], given_only: str | None
) -> tuple[list[inspect.Parameter], list[_Option]]:
    params: list[inspect.Parameter] = []
    options: list[_Option] = []
    for field in fields:
        info = model.model_fields[field]
        spec = flags.get(field, Flag())
        flag = flag_name(field, flags)
        base, optional = _optional(info.annotation)
        annotation = _option_type(spec.type if spec.type is not None else base)
        extra = _bounds(info, base) if spec.type is None else {}
        help_text = _help(info, spec, field)
        required = info.is_required()
        default: Any = None if required else info.get_default(call_default_factory=True)
        show_default: bool | str = True
        if given_only is not None:
            shown = str(spec.show(default) if spec.show else default)
            help_text = f"{help_text} Default: {spec.default_text or given_only.format(default=shown)}."
            default, show_default = None, False
        elif spec.show is not None:
            default = spec.show(default)
        if default is None:
            show_default = False
        option_type = annotation if (default is not None or required) and not optional else annotation | None
        info_obj = typer.Option(
            flag,
            *spec.aliases,
            help=help_text,
            show_default=show_default,
            metavar=spec.metavar,
            envvar=spec.envvar,
            hidden=spec.hidden,
            **extra,
        )
        name = f"{prefix}__{field}"
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[option_type, info_obj],
                default=inspect.Parameter.empty if required else default,
            )
        )
        options.append(_Option(field, name, flag, spec))
    return params, options


def options_from(
    model: type[BaseModel],
    param: str,
    *,
    fields: Sequence[str] | None = None,
    flags: Mapping[str, Flag] | None = None,
    given_only: str | None = None,
    fix: str = "see the command's --help",
) -> Callable[[F], F]:
    """Replace the command's parameter `param` by an option per field of `model` (all, or `fields` in that
    order). Without `given_only` the command gets the validated model; with it, a dict of the fields given
    on the command line, each option's default None, and `given_only` (with `{default}`, the field's) says
    in the help what an absent option leaves."""
    chosen = tuple(fields) if fields is not None else tuple(model.model_fields)
    specs = dict(flags or {})

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        if param not in signature.parameters:
            raise TypeError(f"{func.__name__} has no parameter {param}")
        generated, options = _parameters(model, param, chosen, specs, given_only)
        flag_of = {option.field: option.flag for option in options}

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            values: dict[str, Any] = {}
            for option in options:
                raw = kwargs.pop(option.param)
                # None is an option left out (its default was None): the model's own default applies.
                if raw is None:
                    continue
                values[option.field] = option.spec.parse(raw) if option.spec.parse else raw
            if given_only is not None:
                kwargs[param] = values
            else:
                with flags_of(flag_of, fix=fix):
                    kwargs[param] = model.model_validate(values)
            return func(*args, **kwargs)

        rest = [p for p in signature.parameters.values() if p.name != param]
        # Typer reads the signature: the given parameters in their order, the model's options where the
        # model's parameter stood.
        index = list(signature.parameters).index(param)
        ordered = [*rest[:index], *generated, *rest[index:]]
        ordered = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in ordered]
        command.__signature__ = signature.replace(parameters=ordered)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in ordered}
        command.flags = flag_of  # type: ignore[attr-defined]
        return command  # type: ignore[return-value]

    return decorate


__all__ = ["Flag", "flag_error", "flag_name", "flags_of", "options_from"]
