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
- "hardware": it needs what a test machine has not (a GPU, the 125 GB checkpoint, the Hub, your fleet): it
  is run as written and must stop with the documented error (`code`, `says`); the Hub is kept offline
  (HF_HUB_OFFLINE=1);
- "elsewhere": not run here; `why` says what runs it (CI itself, the Nix tests, ...).

A new line in a document without an entry, or an entry whose line is gone, fails the test: a stale line
fails CI.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import typer

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
    inline: bool = False  # a code span in prose, not a line of a block


@dataclass(frozen=True)
class Expect:
    code: int = 0
    says: str | None = None
    needs: Literal["demo", "hardware", "elsewhere"] | None = None
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
                found.append(DocLine(rel, number, span.strip(), inline=True))
    return found


_PLACEHOLDER = re.compile(r"(?<![$\w.=/-])[A-Z][A-Z0-9_]*(?![\w=])|\.\.\.|…|\[|\||<[a-z]")


@functools.cache
def _root_command() -> Any:
    from glm53.cli.main import app

    return typer.main.get_command(app)


def command_of(words: list[str]) -> tuple[Any, list[str]]:
    """The glm53 (sub)command the leading words name (Typer's Click command), and the words after it."""
    command: Any = _root_command()
    rest = list(words)
    while rest and rest[0] in getattr(command, "commands", {}):
        command = command.commands[rest.pop(0)]
    return command, rest


def option_names(command: Any) -> set[str]:
    names: set[str] = {"--help"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def kind(line: DocLine) -> Literal["name", "synopsis", "concrete"]:
    """A name, a synopsis (placeholders; also every code span in the prose of docs/, which names a command and
    its options rather than a line to type), or a concrete line (README's spans included)."""
    words = line.text.split()
    if words[0] == "glm53" and len(words) > 1 and not command_of(words[1:])[1]:
        return "name"
    if _PLACEHOLDER.search(line.text) or (line.inline and line.path != "README.md"):
        return "synopsis"
    return "concrete"


def all_lines() -> list[DocLine]:
    return [line for document in documents() for line in doc_lines(document)]


# What each concrete line does when run as written (see the module's docstring). Keyed by the line's text: a
# line written twice (README and docs/) has one entry.
HUB = "cannot reach the Hub"
EXPECTED: dict[str, Expect] = {
    # -- the newcomer's lines -----------------------------------------------------------------------------
    "apt-get update && apt-get install -y --no-install-recommends make python3-venv build-essential libnuma1": Expect(
        needs="elsewhere", why="the fresh machine (CI's .ci/run) installs this list before `make test`"
    ),
    "make demo": Expect(needs="elsewhere", why="tests/test_server_e2e.py serves and stops the demo; CI runs it"),
    "make demo PORT=8001": Expect(needs="elsewhere", why="tests/test_doc_lines.py: make passes --port 8001"),
    "make test": Expect(needs="elsewhere", why="what CI runs (.ci/run)"),
    "make setup": Expect(needs="elsewhere", why="creates .venv/; `make demo` and `make test` run it first, as CI does"),
    "make test-fast": Expect(needs="elsewhere", why="the tests without the slow ones; CI runs them all"),
    "make cli-docs": Expect(needs="elsewhere", why="`make lint` fails when docs/cli.md is not what it writes"),
    ". .venv/bin/activate": Expect(
        needs="elsewhere", why="every line here runs as after it: PATH starts with the venv's bin"
    ),
    "nix run": Expect(needs="elsewhere", why="a name in prose; tests/test_nix*.py evaluate the flake's apps"),
    # -- against the demo ------------------------------------------------------------------------------------
    "glm53 bench run --base-url http://127.0.0.1:8000": Expect(needs="demo", says="measuring 2048:512"),
    # -- the second engine without Nix: needs a Python whose torch has CUDA, and a GPU ---------------------------
    "glm53 repro install-engine glm53-engine --python /path/to/python-with-torch": Expect(
        3, "--python /path/to/python-with-torch not found", needs="hardware"
    ),
    "glm53 serve --profile exl3-2x3090": Expect(2, "serve needs the model directory", needs="hardware"),
    # the demo's 2048:512 is none of the recipe's shapes: the rows are printed, and nothing is compared (exit 1)
    "glm53 bench compare glm53-bench": Expect(1, "nothing to compare", needs="demo"),
    "glm53 bench run --base-url http://127.0.0.1:8000 --out after": Expect(needs="demo", says="measuring 2048:512"),
    "glm53 bench compare glm53-bench after": Expect(needs="demo", says="decode tok/s"),
    # -- the real hardware path: the documented error without the GPU host, the checkpoint or the Hub ------
    "glm53 model lock turboderp/GLM-5.3-Flash-exl3 --revision 332ab457b709b7ba30dd9a448be5de03b80a7ac9 "
    "--out glm53.lock.json": Expect(3, HUB, needs="hardware"),
    "glm53 model download turboderp/GLM-5.3-Flash-exl3 --revision 332ab457b709b7ba30dd9a448be5de03b80a7ac9 "
    "--model-dir /srv/models/glm53 --checkpoint-lock glm53.lock.json": Expect(
        2, "checkpoint lock not found: glm53.lock.json", needs="hardware"
    ),
    "REV=332ab457b709b7ba30dd9a448be5de03b80a7ac9": Expect(0),
    "glm53 model lock turboderp/GLM-5.3-Flash-exl3 --revision $REV --out glm53.lock.json": Expect(
        3, HUB, needs="hardware"
    ),
    "glm53 model download turboderp/GLM-5.3-Flash-exl3 --revision $REV --model-dir /srv/models/glm53 "
    "--checkpoint-lock glm53.lock.json": Expect(2, "checkpoint lock not found: glm53.lock.json", needs="hardware"),
    "glm53 model install --model-dir /srv/models/glm53": Expect(
        2, "model directory not found: /srv/models/glm53", needs="hardware"
    ),
    "glm53 model verify --model-dir /srv/models/glm53 --checkpoint-lock glm53.lock.json": Expect(
        2, "model directory not found: /srv/models/glm53", needs="hardware"
    ),
    "glm53 doctor --model-dir /srv/models/glm53": Expect(
        1, "--model-dir /srv/models/glm53 does not exist", needs="hardware"
    ),
    "glm53 plan host --model-dir /srv/models/glm53": Expect(
        2, "--model-dir /srv/models/glm53 does not exist", needs="hardware"
    ),
    "glm53 serve --profile agent-256k --model-dir /srv/models/glm53": Expect(
        2, "--model-dir /srv/models/glm53 does not exist", needs="hardware"
    ),
    "nix --extra-experimental-features 'nix-command flakes' run .#default -- --model-dir /srv/models/glm53": Expect(
        needs="elsewhere", why="needs the GPU host and the engine pins; tests/test_nix*.py evaluate the app"
    ),
    "nix --extra-experimental-features 'nix-command flakes' build .#image && docker load -i result": Expect(
        needs="elsewhere",
        why="pulls the vendor image (network, pins); tests/test_nix_flake.py evaluates it and its pull",
    ),
    "docker run --device nvidia.com/gpu=all --ipc host --ulimit memlock=-1 -p 127.0.0.1:8000:8000 "
    "-v /srv/models/glm53:/model:ro glm53:0.1.0": Expect(
        needs="elsewhere", why="needs the GPU host and the container toolkit; tests/test_nix_flake.py runs the app"
    ),
    "glm53 systemd-unit --model-dir /srv/models/glm53 --out /etc/systemd/system/glm53.service": Expect(
        needs="elsewhere", why="writes /etc: tests/test_systemd_unit.py writes and checks the same unit elsewhere"
    ),
    "glm53 repro audit-build .#glm53": Expect(
        needs="elsewhere", why="builds twice with Nix; tests/test_repro.py runs it on a small derivation"
    ),
    ".venv/bin/python benchmarks/bench_verify.py": Expect(
        needs="elsewhere", why="writes 3 GiB of shards: a benchmark, run by hand"
    ),
    # -- docs/plan.md: the recipe's rig from any machine -----------------------------------------------------
    "glm53 plan host --rig recipe-2x3090": Expect(0, "CPU_OFFLOAD_GB"),
    "glm53 plan host --rig recipe-2x3090 --profile agent-256k --max-model-len 131072": Expect(0, "131,072"),
    "glm53 plan host --gpu-memory 24GiB,24GiB --ram 128GiB --cpus 32cx2t/8": Expect(0, "planned for 128.00 GiB RAM"),
    "glm53 plan trace synth --steps 4000 --out t.jsonl": Expect(0, "wrote t.jsonl"),
    "glm53 plan host --rig recipe-2x3090 --stats t.jsonl --env > plan.env": Expect(0),
    "glm53 plan host --rig recipe-2x3090 --stats t.jsonl --out plan/": Expect(0, "plan.env"),
    "glm53 plan simulate t.jsonl --plots-dir plots/": Expect(0, "plots"),
    "glm53 plan trace synth --shape bursty --seed 3 --steps 4000 --out b.npz": Expect(0, "wrote b.npz"),
    "glm53 plan trace import capture.jsonl --out real.jsonl --drop-incomplete": Expect(
        needs="elsewhere", why="needs a capture file; tests/test_plan_recommend.py imports captures of both forms"
    ),
    "glm53 probe --json > probe.json": Expect(3, "no CUDA device", needs="hardware"),
    "glm53 plan host --bandwidth probe.json --stats t.jsonl --out /var/lib/glm53/plan": Expect(
        3, "no NVIDIA GPU found", needs="hardware"
    ),
    # -- docs/serve.md: the ExLlamaV3 engine (TabbyAPI) -------------------------------------------------------
    "glm53 serve --profile exl3-2x3090 --rig recipe-2x3090 --dry-run": Expect(0, "planned for rig recipe-2x3090"),
    "GLM53_TABBYAPI_DIR=/path/to/tabbyAPI glm53 serve --profile exl3-1gpu --model-dir /srv/models/glm53": Expect(
        2, "--model-dir /srv/models/glm53 does not exist", needs="hardware"
    ),
    "nix --extra-experimental-features 'nix-command flakes' run .#serve-exl3 -- --model-dir /srv/models/glm53": Expect(
        needs="elsewhere", why="needs the GPU host; tests/test_nix_exl3.py evaluates the app and its closure"
    ),
    # -- docs/plan.md: the ExLlamaV3 engine's plan ---------------------------------------------------------
    "glm53 plan host --profile exl3-2x3090 --rig recipe-2x3090": Expect(0, "predicted decode"),
    "glm53 plan host --profile exl3-1gpu --rig one-3090 --env": Expect(0, "EXL3_MOE_CPU_SPLIT="),
    "glm53 plan host --profile exl3-2x3090 --stats routing.jsonl --out /var/lib/glm53/plan": Expect(
        2, "routing.jsonl not found", needs="hardware"
    ),
    "glm53 serve --profile exl3-2x3090 --plan-env /var/lib/glm53/plan/plan.env --model-dir /srv/models/glm53": Expect(
        2, "--model-dir /srv/models/glm53 does not exist", needs="hardware"
    ),
    # -- docs/router.md: a fleet file describing your boxes ------------------------------------------------
    "glm53 router fleet.toml --dry-run --json": Expect(2, "fleet.toml not found", needs="hardware"),
    "glm53 router fleet.toml": Expect(2, "fleet.toml not found", needs="hardware"),
}
