"""The command lines of the README and docs/, found as a reader finds them, and what each one does when run as
written. tests/test_doc_lines.py runs them; this file says what to expect.

A command line is every line of a ```sh (bash, shell, console) block, and every inline `code span` that starts
with a command (glm53, make, nix, docker, apt-get) in README.md and docs/*.md (docs/cli.md is generated from
--help and checked by tests/test_cli_reference.py). Three kinds:

- a name (`glm53 bench`, `glm53 model lock`): `glm53 ... --help` must exist;
- a synopsis (placeholders: DIR, FILE, N, [--x], a|b, ...): the command and each --option must exist;
- a concrete line: it must have an entry in EXPECTED below, which says what it does when run as written.

An entry's `needs` says where it can run:
- None: here, as written, in a shell whose PATH starts with the venv's bin (as after `. .venv/bin/activate`),
  in one scratch directory per document, the document's lines in order; `code` and `says` (a text its output
  contains) are checked;
- "demo": the same, against the demo server (`make demo`, 127.0.0.1:8000; the tests' one server stands in
  for it, at its own port);
- "gpu": it needs what this machine has not (a GPU, the 125 GB checkpoint, the Hub): it is run as written
  and must stop with the documented error (`code`, `says`);
- "elsewhere": not run here; `why` says what runs it (CI itself, the Nix tests, ...).

A new line in a document without an entry, or an entry whose line is gone, fails the test: a stale line
fails CI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("glm53", "make", "nix", "docker", "apt-get")
_FENCE = re.compile(r"^\s*```\s*(\w*)\s*$")
_SPAN = re.compile(r"`([^`\n]+)`")
_SHELL = {"sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class DocLine:
    path: str  # relative to the repository root
    line: int
    text: str  # as written, continuation lines joined, the trailing comment removed


@dataclass(frozen=True)
class Expect:
    code: int = 0
    says: str | None = None
    needs: Literal["demo", "gpu", "elsewhere"] | None = None
    why: str = ""


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]


def _strip_comment(text: str) -> str:
    # A `#` that starts a word outside quotes begins a shell comment (`.#default` does not).
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def doc_lines(path: Path) -> list[DocLine]:
    rel = str(path.relative_to(ROOT))
    found: list[DocLine] = []
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = _FENCE.match(raw)
        if opening is not None:
            fence = None if fence is not None else opening.group(1).lower()
            continue
        if fence is not None:
            if fence not in _SHELL:
                continue
            text = raw.strip().removeprefix("$ ")
            if pending is not None:
                text = pending[1] + " " + text
                number = pending[0]
                pending = None
            if text.endswith("\\"):
                pending = (number, text[:-1].rstrip())
                continue
            text = _strip_comment(text)
            if text:
                found.append(DocLine(rel, number, text))
            continue
        for span in _SPAN.findall(raw):
            if span.split(" ", 1)[0] in COMMANDS and " " in span:
                found.append(DocLine(rel, number, span.strip()))
    return found


_PLACEHOLDER = re.compile(r"(?<![$\w.=/-])[A-Z][A-Z0-9_]*(?![\w=])|\.\.\.|…|\[|\||<[a-z]")


def kind(text: str) -> Literal["name", "synopsis", "concrete"]:
    words = text.split()
    if words[0] == "glm53" and all(re.fullmatch(r"[a-z][a-z-]*", w) for w in words[1:]):
        return "name"
    if _PLACEHOLDER.search(text):
        return "synopsis"
    return "concrete"
