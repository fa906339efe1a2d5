"""Every flag of a router launch checked against the installed vllm-router's own parser, read from its `--help`.

The option table (each flag, whether it takes a value, its choices) is parsed from the help that the router's
argparse parser prints, run through the same command that will start it, so a renamed flag or a policy the
installed router does not know fails here, named, before anything starts. `--help` takes a second or two, so
the table is cached per vllm-router version and Python under $XDG_CACHE_HOME/glm53/router-flags/.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_text, parse_json
from glm53.proc import TimedOut, environment, run, text

HELP_TIMEOUT_S = 60.0


class RouterOption(BaseModel):
    model_config = ConfigDict(frozen=True)

    takes_value: bool
    choices: list[str] | None = None


class RouterFlagCheck(BaseModel):
    model_config = ConfigDict(frozen=True)

    checked: bool
    router_version: str | None
    cached: bool = False
    reason: str | None = None


def router_version() -> str | None:
    try:
        return importlib.metadata.distribution("vllm-router").version
    except importlib.metadata.PackageNotFoundError:
        return None


# An option line of argparse's help: two spaces, optional short form, the long flag, then its metavar or
# {choices}, then (after two spaces or a line break) the help text.
_OPTION = re.compile(r"^  (?:-\w, )?(--[A-Za-z0-9][\w-]*)(?: (\{[^}]*\}|\S+(?: \S+)*?))?(?:  |$)")


def parse_help(text: str) -> dict[str, RouterOption]:
    """The option table of an argparse `--help` text."""
    table: dict[str, RouterOption] = {}
    for line in text.splitlines():
        match = _OPTION.match(line)
        if match is None:
            continue
        flag, meta = match.group(1), match.group(2)
        choices = meta[1:-1].split(",") if meta and meta.startswith("{") else None
        table[flag] = RouterOption(takes_value=meta is not None, choices=choices)
    return table


def _cache_path(version: str, command: Sequence[str]) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(json.dumps([version, list(command)]).encode()).hexdigest()[:32]
    return base / "glm53" / "router-flags" / f"{digest}.json"


def option_table(
    command: Sequence[str], version: str, *, use_cache: bool = True
) -> tuple[dict[str, RouterOption], bool]:
    """(table, from cache) for the router started by `command`."""
    cache = _cache_path(version, command)
    if use_cache and cache.is_file():
        try:
            raw = parse_json(cache.read_bytes(), what=f"router flag cache {cache}")
            return {k: RouterOption.model_validate(v) for k, v in raw["options"].items()}, True
        except Exception:  # a broken cache only costs a re-read
            pass
    try:
        result = run(
            [*command, "--help"],
            env=environment(),
            what="reading vllm-router's options",
            timeout=HELP_TIMEOUT_S,
            missing_fix="pip install vllm-router==0.1.17",
        )
    except TimedOut as exc:
        raise Unavailable(f"`{' '.join(command)} --help` did not answer in {HELP_TIMEOUT_S} s") from exc
    table = parse_help(result.stdout.decode("utf-8", errors="replace"))
    if result.returncode != 0 or "--worker-urls" not in table:
        raise Unavailable(
            f"`{' '.join(command)} --help` did not print vllm-router's options (exit {result.returncode})",
            fix=(text(result.stderr).splitlines() or ["install vllm-router"])[-1],
        )
    if use_cache:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            payload = {"version": version, "options": {k: v.model_dump() for k, v in table.items()}}
            atomic_write_text(cache, json.dumps(payload) + "\n")
        except Exception:  # a cache that cannot be written only costs time
            pass
    return table, False


def check_args(args: Sequence[str], table: dict[str, RouterOption], version: str) -> None:
    """Raise BadInput naming the first flag or value the router's parser would refuse."""
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if not arg.startswith("--"):
            raise BadInput(f"vllm-router {version}: unexpected argument {arg!r}")
        option = table.get(arg)
        if option is None:
            close = difflib.get_close_matches(arg, list(table), n=3, cutoff=0.6)
            fix = f"vllm-router {version} knows {', '.join(close)}" if close else "see `vllm-router --help`"
            raise BadInput(f"vllm-router {version} rejects the flag {arg}: no such option", fix=fix)
        if not option.takes_value:
            continue
        values = []
        while i < len(items) and not items[i].startswith("--"):
            values.append(items[i])
            i += 1
        if not values:
            raise BadInput(f"vllm-router {version}: {arg} needs a value")
        if option.choices is not None:
            for value in values:
                if value not in option.choices:
                    raise BadInput(
                        f"vllm-router {version} rejects {arg} {value}",
                        fix=f"it knows {', '.join(option.choices)}",
                    )


def check_router_flags(argv: Sequence[str], command: Sequence[str], *, use_cache: bool = True) -> RouterFlagCheck:
    """Check the flags of a launch argv (starting with `command`) against the installed router's parser."""
    version = router_version()
    if version is None:
        return RouterFlagCheck(checked=False, router_version=None, reason="vllm-router is not installed here")
    items = list(argv)
    if items[: len(command)] != list(command):
        raise BadInput("the router argv does not start with the router command")
    table, cached = option_table(command, version, use_cache=use_cache)
    check_args(items[len(command) :], table, version)
    return RouterFlagCheck(checked=True, router_version=version, cached=cached)


__all__ = ["RouterFlagCheck", "RouterOption", "check_args", "check_router_flags", "parse_help", "router_version"]
