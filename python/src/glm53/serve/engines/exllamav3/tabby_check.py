"""Check a rendered TabbyAPI config with TabbyAPI's own schema, and TabbyAPI's Python for what it imports,
before anything starts.

TabbyAPI validates its config with `common.config_models.TabbyConfigModel` (pydantic) and silently ignores a
field it does not know. The check runs that model, from the TabbyAPI tree the launch will start, in a child
process with the interpreter that will run it: a field name glm53 gets wrong, or a value TabbyAPI refuses, stops
the start with TabbyAPI's own words (exit 2) instead of a server that runs with a default.

The same child reads the tree's own `pyproject.toml` (`[project].dependencies`, markers evaluated for that
Python, and its `cu12` extra by name: torch, triton, flash-linear-attention, exllamav3) and looks each
distribution up in that Python: a package TabbyAPI imports only once the server starts (uvicorn,
fastapi, ...) would otherwise end the server just after the exec. Then it imports what TabbyAPI's entry point
imports (main.py's imports, those inside its functions too: the server's modules), which catches a module no
declared distribution provides, or one that is installed but broken. One missing or too old is exit 3, naming it
and the command that installs it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from glm53.errors import BadInput, Unavailable
from glm53.fsutil import parse_json
from glm53.host.source_tree import checkout_commit
from glm53.proc import TimedOut, run, text
from glm53.recipe.pins import find_repro_lock, load_repro_lock
from glm53.safetext import quoted
from glm53.serve.engines.exllamav3.tabby import CONFIG_NAME, clean_environment, tabby_main
from glm53.serve.launch import FlagCheck, LaunchSpec, environment_for_exec

CHECK_TIMEOUT_S = 60
# Run by TabbyAPI's interpreter with TabbyAPI's tree first on sys.path; prints one JSON line.
_CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from common.config_models import TabbyConfigModel
data = json.loads(sys.stdin.read())
defaults = TabbyConfigModel()
unknown = []
for section, fields in data.items():
    if section not in TabbyConfigModel.model_fields:
        unknown.append(section)
        continue
    known = type(getattr(defaults, section)).model_fields
    unknown += [f"{section}.{field}" for field in fields if field not in known]
try:
    TabbyConfigModel.model_validate(data)
    error = None
except Exception as exc:
    error = str(exc)

# TabbyAPI's declared dependencies, checked in this Python (TabbyAPI's own): its runtime list with versions,
# and its CUDA extra (torch, triton, flash-linear-attention, exllamav3) by name only, since glm53 pins those.
import tomllib
from importlib import metadata
missing = []
declared = []
try:
    with open(sys.argv[1] + "/pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    runtime, cuda = project["dependencies"], project.get("optional-dependencies", {}).get("cu12", [])
    for name, value in (("dependencies", runtime), ("optional-dependencies.cu12", cuda)):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise TypeError(f"project.{name} is not a list of requirement strings")
    declared = [(text, True) for text in runtime] + [(text, False) for text in cuda]
except (OSError, KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as exc:
    missing.append({"name": "pyproject.toml", "spec": "", "found": None, "why": f"{type(exc).__name__}: {exc}"})
# a full distribution that provides the same modules as the one declared
aliases = {"fastapi-slim": ["fastapi"]}
try:
    from packaging.requirements import Requirement
except ImportError:
    declared = []
    missing.append({"name": "packaging", "spec": "packaging", "found": None, "why": "not installed"})
seen = set()
for text, versioned in declared:
    try:
        req = Requirement(text)
    except Exception as exc:  # packaging's InvalidRequirement: a line no installer could read either
        missing.append({"name": "pyproject.toml", "spec": "", "found": None, "why": f"{text!r}: {exc}"})
        continue
    if req.marker is not None and not req.marker.evaluate() or req.name.lower() in seen:
        continue
    seen.add(req.name.lower())
    found = None
    for name in [req.name, *aliases.get(req.name.lower(), [])]:
        try:
            found = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            continue
    wanted = str(req.name) + (str(req.specifier) if versioned else "")
    if found is None:
        missing.append({"name": req.name, "spec": wanted, "found": None, "why": "not installed"})
    elif versioned and req.specifier and not req.specifier.contains(found, prereleases=True):
        missing.append({"name": req.name, "spec": wanted, "found": found, "why": f"{found} installed"})

# What TabbyAPI's entry point imports, imported here: main.py's own imports, at its top and inside its functions
# (the server's modules, uvicorn among them, are imported only once it starts). Imports in the branches of one
# `if` are alternatives (uvloop or winloop): one of them must import.
import ast, importlib
def imported(node):
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []
def groups(tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            branches = [[n for s in node.body for n in ast.walk(s)], [n for s in node.orelse for n in ast.walk(s)]]
            names = [[m for n in b for m in imported(n)] for b in branches]
            if all(names):
                found.append(("any", names[0] + names[1], [id(n) for b in branches for n in b]))
    skip = {i for _, _, ids in found for i in ids}
    for node in ast.walk(tree):
        if id(node) not in skip:
            found += [("all", [name], []) for name in imported(node)]
    return found
if not missing:
    main_path = sys.argv[1] + "/main.py"
    try:
        with open(main_path, encoding="utf-8") as f:
            wanted = groups(ast.parse(f.read(), main_path))
    except (OSError, SyntaxError, ValueError) as exc:
        wanted = []
        missing.append({"name": "main.py", "spec": "", "found": None, "why": f"{type(exc).__name__}: {exc}"})
    seen_modules = set()
    for kind, names, _ in wanted:
        failures = []
        for name in names:
            if name in seen_modules:
                failures = []
                break
            try:
                importlib.import_module(name)
                seen_modules.add(name)
                failures = []
                break
            except ModuleNotFoundError as exc:
                failures.append((exc.name or name, f"module {exc.name or name} not found (main.py imports {name})"))
            except Exception as exc:  # a module that is there but fails: named with its error
                failures.append((name, f"importing {name} failed: {type(exc).__name__}: {str(exc)[:200]}"))
        for module, why in failures[:1]:
            missing.append({"name": module.split(".")[0], "spec": "", "found": None, "why": why, "module": True})
# glm53's runner in front of main.py (EXPERT_CACHE=1, --capture-routing): `python -m RUNNER` imports it first.
if len(sys.argv) > 2:
    try:
        importlib.import_module(sys.argv[2])
    except Exception as exc:
        missing.append({"name": "glm53", "spec": "", "found": None, "runner": True,
                        "why": f"glm53's runner {sys.argv[2]} does not import: {type(exc).__name__}: {str(exc)[:200]}"})
print(json.dumps({"unknown": unknown, "error": error, "missing": missing}))
"""


def _tabby_dir(spec: LaunchSpec) -> str | None:
    main = tabby_main(spec.argv)
    if main.startswith("$"):
        return None
    return str(PurePosixPath(main).parent)


def _runner_module(spec: LaunchSpec) -> list[str]:
    """glm53's module that runs TabbyAPI's main.py (`PYTHON -m MODULE ... main.py`), as a one-item list; [] when
    main.py runs directly."""
    return [spec.argv[2]] if len(spec.argv) > 2 and spec.argv[1] == "-m" else []


def run_check(spec: LaunchSpec) -> tuple[list[str], str | None, list[dict[str, str | None]]]:
    """(unknown fields, TabbyAPI's validation error or None, the dependencies its Python lacks). Unavailable
    when TabbyAPI cannot be run."""
    directory = _tabby_dir(spec)
    if directory is None:
        raise Unavailable(
            "TabbyAPI's location is not set (GLM53_TABBYAPI_DIR)",
            fix="set GLM53_TABBYAPI_DIR to TabbyAPI's source tree at the pinned commit (docs/serve.md)",
        )
    try:
        # `-c CODE` ends Python's options: the directory after it is the script's sys.argv[1], never an option.
        done = run(
            [spec.argv[0], "-c", _CHECK, directory, *_runner_module(spec)],
            # what TabbyAPI itself will run with (its Python's search path included), without any key
            env=environment_for_exec(spec, clean_environment(os.environ), None),
            what="checking TabbyAPI's config",
            input=spec.files[CONFIG_NAME].encode(),
            timeout=CHECK_TIMEOUT_S,
            missing_fix="set GLM53_TABBYAPI_PYTHON to TabbyAPI's Python",
        )
    except TimedOut as exc:
        raise Unavailable(f"TabbyAPI's config schema did not answer in {CHECK_TIMEOUT_S} s") from exc
    lines = done.stdout.decode("utf-8", errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = text(done.stderr).splitlines()[-1:] or ["no output"]
        raise Unavailable(
            f"cannot load TabbyAPI's config schema from {directory}: {tail[0][:300]}",
            fix="GLM53_TABBYAPI_DIR must be TabbyAPI's source tree, GLM53_TABBYAPI_PYTHON a Python with its "
            "dependencies (pydantic)",
        )
    result = parse_json(lines[-1], what="TabbyAPI's config check")
    try:
        missing = [
            {key: (None if row.get(key) is None else str(row[key])) for key in ("name", "spec", "found", "why")}
            for row in result["missing"]
        ]
        error = None if result["error"] is None else str(result["error"])
        return [str(name) for name in result["unknown"]], error, missing
    except (KeyError, TypeError) as exc:
        raise Unavailable(f"TabbyAPI's config check printed {quoted(lines[-1])}") from exc


def _lacking(spec: LaunchSpec, missing: list[dict[str, str | None]]) -> Unavailable:
    """What TabbyAPI's Python lacks, with the command that installs it there."""
    rows = [f"{row['spec'] or row['name']} ({row['why']})" for row in missing]
    packages = [row for row in missing if row["name"] not in ("pyproject.toml", "glm53")]
    wanted = " ".join(f"'{row['spec'] or row['name']}'" for row in packages)
    fixes = [f"install into TabbyAPI's Python: {spec.argv[0]} -m pip install {wanted}"] if wanted else []
    if any(row["name"] == "glm53" for row in missing):
        fixes.append(
            f"{spec.argv[0]} must import glm53 (its GPU expert cache and routing recorder run inside TabbyAPI): "
            "`glm53 repro install-engine` puts glm53's source on its engine's path; elsewhere add a .pth naming "
            "glm53's python/src to that Python's site-packages"
        )
    if not fixes:
        fixes.append(
            "GLM53_TABBYAPI_DIR must be TabbyAPI's source tree at the pinned commit (repro.lock.json engine.tabbyapi)"
        )
    fix = "; ".join(fixes)
    return Unavailable(f"TabbyAPI's Python ({spec.argv[0]}) lacks what TabbyAPI imports: {'; '.join(rows)}", fix=fix)


def wrong_commit(spec: LaunchSpec) -> BadInput | None:
    """A TabbyAPI tree that is a git checkout of another commit than the lock's (engine.tabbyapi.rev); None
    where it is the lock's, or cannot be told (a Nix store copy has no .git), or no lock is at hand."""
    directory = _tabby_dir(spec)
    lock = find_repro_lock(Path.cwd())
    if directory is None or lock is None:
        return None
    pinned = load_repro_lock(lock).engine.tabbyapi.rev
    found = checkout_commit(Path(directory))
    if found is None or pinned is None or found == pinned:
        return None
    return BadInput(
        f"TabbyAPI at {directory} is checked out at {found}, but repro.lock.json pins {pinned}",
        fix=f"git -C {directory} checkout {pinned} (or point GLM53_TABBYAPI_DIR at a tree of that commit)",
    )


def tabby_config_check(spec: LaunchSpec) -> FlagCheck:
    """For a dry run: the result, or why nothing was checked."""
    if (mismatch := wrong_commit(spec)) is not None:
        return FlagCheck(checked=False, vllm_version=None, reason=mismatch.message)
    try:
        unknown, error, missing = run_check(spec)
    except Unavailable as exc:
        return FlagCheck(checked=False, vllm_version=None, reason=exc.message)
    if unknown or error:
        problems = [f"unknown fields: {', '.join(unknown)}"] if unknown else []
        problems += [error] if error else []
        return FlagCheck(checked=False, vllm_version=None, reason="TabbyAPI refuses the config: " + "; ".join(problems))
    if missing:
        return FlagCheck(checked=False, vllm_version=None, reason=_lacking(spec, missing).message)
    return FlagCheck(checked=True, vllm_version=f"TabbyAPI ({_tabby_dir(spec)})")


def require_tabby_config(spec: LaunchSpec) -> str:
    """For a start: the tree is the pinned commit where it can be told, TabbyAPI accepts every field and its
    Python has what TabbyAPI imports, or nothing starts."""
    if (mismatch := wrong_commit(spec)) is not None:
        raise mismatch
    unknown, error, missing = run_check(spec)
    if unknown:
        raise BadInput(
            f"TabbyAPI does not know the config fields {', '.join(unknown)}",
            fix="this TabbyAPI is not the pinned commit (repro.lock.json engine.tabbyapi)",
        )
    if error:
        raise BadInput(f"TabbyAPI refuses the config: {error[:800]}", fix="fix the profile value it names")
    if missing:
        raise _lacking(spec, missing)
    return f"config accepted by TabbyAPI's schema ({_tabby_dir(spec)}); its Python has every dependency it declares"


__all__ = ["require_tabby_config", "run_check", "tabby_config_check"]
