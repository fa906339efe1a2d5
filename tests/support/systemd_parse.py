"""How systemd reads the directives our units write, so that a test can read them back as the service will see
them. A model of systemd's own code (src/core/load-fragment.c, src/basic/extract-word.c, src/basic/escape.c,
src/basic/env-util.c; systemd.service(5) "Command lines", systemd.unit(5) "Specifiers"):

- ExecStart=: specifiers expanded over the whole value first (`%%` -> `%`), then split into words with
  EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE (single or double quotes anywhere in a word, C escapes), then, when the
  command runs, `$$` -> `$`, `${NAME}` -> its value and a word that is only `$NAME` -> the value split at
  white space; any other `$` stays.
- ReadOnlyPaths= and the other path lists: split with EXTRACT_UNQUOTE only (a backslash takes the next
  character as it is), a leading `-` (missing paths ignored) and `+` taken off, then specifiers expanded.
- LoadCredential=ID:PATH: the ID up to the first `:`, the path the rest of the line with specifiers expanded.

The exact argv[0] systemd resolves is also checked by systemd itself: `systemd-analyze verify` fails a unit whose
command is not an executable file (tests/test_systemd_escaping.py puts hostile characters in that path).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

WHITESPACE = " \t\n\r"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SystemdParseError(ValueError):
    pass


def expand_specifiers(text: str, specifiers: Mapping[str, str]) -> str:
    """unit_full_printf: `%%` is `%`, `%X` the specifier's value; an unknown one is an error (the line is
    ignored by systemd)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(text):
            raise SystemdParseError("a lone % at the end")
        key = text[i + 1]
        if key == "%":
            out.append("%")
        elif key in specifiers:
            out.append(specifiers[key])
        else:
            raise SystemdParseError(f"unknown specifier %{key}")
        i += 2
    return "".join(out)


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """The character a C escape starting after the backslash at text[i] stands for, and the index after it."""
    char = text[i]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], i + 1
    if char in "\\\"'":
        return char, i + 1
    if char == "x":
        return chr(int(text[i + 1 : i + 3], 16)), i + 3
    if char == "u":
        return chr(int(text[i + 1 : i + 5], 16)), i + 5
    if char == "U":
        return chr(int(text[i + 1 : i + 9], 16)), i + 9
    if char in "01234567":
        return chr(int(text[i : i + 3], 8)), i + 3
    raise SystemdParseError(f"invalid escape \\{char}")


def extract_words(text: str, *, cunescape: bool) -> list[str]:
    """extract_first_word() repeated with EXTRACT_UNQUOTE (and EXTRACT_CUNESCAPE when asked)."""
    words: list[str] = []
    i = 0
    while True:
        while i < len(text) and text[i] in WHITESPACE:
            i += 1
        if i >= len(text):
            return words
        word: list[str] = []
        quote: str | None = None
        while i < len(text):
            char = text[i]
            if quote is None and char in WHITESPACE:
                break
            if char == "\\":
                if i + 1 >= len(text):
                    raise SystemdParseError("a backslash at the end")
                if cunescape:
                    decoded, i = _cunescape_one(text, i + 1)
                    word.append(decoded)
                else:
                    word.append(text[i + 1])
                    i += 2
                continue
            if quote is not None:
                if char == quote:
                    quote = None
                else:
                    word.append(char)
            elif char in "\"'":
                quote = char
            else:
                word.append(char)
            i += 1
        if quote is not None:
            raise SystemdParseError("unbalanced quotes")
        words.append("".join(word))


def replace_env(word: str, env: Mapping[str, str]) -> list[str]:
    """replace_env_argv() for one word: `$NAME` alone is split into words, otherwise `$$` -> `$` and
    `${NAME}` -> the value; any other `$` is kept."""
    if word.startswith("$") and _ENV_NAME.fullmatch(word[1:]):
        return env.get(word[1:], "").split()
    out: list[str] = []
    i = 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${", i) and (end := word.find("}", i)) != -1:
            out.append(env.get(word[i + 2 : end], ""))
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return ["".join(out)]


def parse_exec(value: str, *, specifiers: Mapping[str, str], env: Mapping[str, str] | None = None) -> list[str]:
    """An ExecStart= value as the argv the service is started with (prefixes such as `-` or `+` taken off)."""
    words = extract_words(expand_specifiers(value, specifiers), cunescape=True)
    if not words:
        raise SystemdParseError("an empty command line")
    first = words[0].lstrip("-@:+!|")
    argv = [first, *words[1:]]
    return [expanded for word in argv for expanded in replace_env(word, env or {})]


def parse_paths(value: str, *, specifiers: Mapping[str, str]) -> list[tuple[str, bool]]:
    """A ReadOnlyPaths= value: (path, ignored when missing) for each entry."""
    entries = []
    for word in extract_words(value, cunescape=False):
        optional = word.startswith("-")
        word = word.removeprefix("-").removeprefix("+")
        entries.append((expand_specifiers(word, specifiers), optional))
    return entries


def parse_credential(value: str, *, specifiers: Mapping[str, str]) -> tuple[str, str]:
    name, _, path = value.partition(":")
    return name, expand_specifiers(path, specifiers)


def directives(unit_text: str, key: str) -> list[str]:
    """Every value of `key` in a unit file's text, in order (one per line, as both renderers write them)."""
    return [line.split("=", 1)[1] for line in unit_text.splitlines() if line.startswith(f"{key}=")]


__all__ = [
    "SystemdParseError",
    "directives",
    "expand_specifiers",
    "extract_words",
    "parse_credential",
    "parse_exec",
    "parse_paths",
    "replace_env",
]
