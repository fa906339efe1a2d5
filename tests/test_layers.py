"""The package's layers (docs/architecture.md) hold by test.

Every import in python/src/glm53 is read with `ast`: at module level, under TYPE_CHECKING and inside functions,
relative ones resolved. An import between two packages must be an edge of ALLOWED, which follows the flow order

    errors, safetext, output, fsutil, proc -> host, checkpoint, recipe -> plan -> preflight -> serve
        -> repro, router, bench -> cli

(a package imports only packages to its left; imports inside one package are always allowed). Inside `plan`, the
four systems are sub-packages in their own order (PLAN_ALLOWED):

    finite, parallel, files -> inputs -> routing -> cache -> vllm, exllamav3

and no module imports, through any chain, a module that imports it back (no cycle, type-only ones included). An
import inside a
function is only ever a heavy or optional third-party dependency, and a comment saying so (`# heavy: ...` or
`# optional: ...`) stands on its line or on the line before it (a run of imports shares the comment above it).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "python" / "src"
PACKAGE = SOURCE / "glm53"

# "glm53" is the package's own __init__ (its version); errors, safetext, output, fsutil, proc and constants (the
# default address, the size units) are modules of the lowest layer.
_FOUNDATION = frozenset({"glm53", "errors", "safetext", "output", "fsutil", "proc", "constants"})
_FACTS = _FOUNDATION | {"host", "checkpoint", "recipe"}
_PLANNED = _FACTS | {"plan"}
_CHECKED = _PLANNED | {"preflight"}
_SERVED = _CHECKED | {"serve"}

# Package -> the packages it may import. Every package under glm53 must be listed: a new one takes its place here.
ALLOWED: dict[str, frozenset[str]] = {
    "glm53": frozenset(),
    "errors": frozenset(),
    "safetext": frozenset(),
    "output": frozenset({"errors", "safetext"}),
    "fsutil": frozenset({"errors", "safetext"}),
    "proc": frozenset({"errors", "safetext"}),
    "constants": frozenset(),
    "host": _FOUNDATION,
    "checkpoint": _FOUNDATION,
    "recipe": _FOUNDATION,
    "plan": _FACTS,
    "preflight": _PLANNED,
    "serve": _CHECKED,
    "repro": _SERVED,
    "router": _SERVED,
    # The one edge inside a layer: a bench report records the environment manifest (glm53.repro.manifest).
    "bench": _SERVED | {"repro"},
    "cli": _SERVED | {"repro", "router", "bench"},
}

# Inside plan: sub-package (or top-level module of plan) -> what of plan it may import. The two engines' planners
# stand side by side and never read each other.
_PLAN_BASE = frozenset({"finite", "parallel", "files"})
PLAN_ALLOWED: dict[str, frozenset[str]] = {
    **{name: frozenset() for name in _PLAN_BASE},
    "inputs": _PLAN_BASE,
    "routing": _PLAN_BASE | {"inputs"},
    "cache": _PLAN_BASE | {"inputs", "routing"},
    "vllm": _PLAN_BASE | {"inputs", "routing", "cache"},
    "exllamav3": _PLAN_BASE | {"inputs", "routing", "cache"},
}

_MARKER = re.compile(r"#\s*(heavy|optional)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. glm53.plan.vllm.planner
    line: int
    target: str  # the imported module (relative imports resolved), e.g. glm53.host.facts or numpy
    in_function: bool
    commented: bool  # a heavy/optional comment on its line or on the line before


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    """glm53.plan.vllm.planner -> plan; glm53.errors -> errors; glm53 -> glm53."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def plan_part(module: str) -> str | None:
    """glm53.plan.cache.policies -> cache; glm53.plan.finite -> finite; glm53.plan -> None (its __init__)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "plan" else None


def _comments(source: str) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {token.start[0]: token.string for token in tokens if token.type == tokenize.COMMENT}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if not node.level:
        return [node.module or ""]
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    prefix = ".".join([*base, *([node.module] if node.module else [])])
    if node.module:
        return [prefix]
    # `from . import x`: x is a module of that package when there is one, else a name defined in it.
    return [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix for alias in node.names]


def imports_of(module: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments = _comments(source)
    statements = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    starts = {line: node.lineno for node in statements for line in range(node.lineno, (node.end_lineno or 0) + 1)}
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)

    def commented(node: ast.Import | ast.ImportFrom) -> bool:
        own = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if any(_MARKER.search(comments.get(line, "")) for line in own):
            return True
        above = node.lineno - 1
        while above in starts:  # the imports just above share the comment over them
            above = starts[above] - 1
        return bool(_MARKER.search(comments.get(above, "")))

    found = []
    for node in statements:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            targets = _resolve(module, path.name == "__init__.py", node)
        found += [Import(module, node.lineno, target, id(node) in in_function, commented(node)) for target in targets]
    return found


ALL_IMPORTS = [found for module, path in MODULES.items() for found in imports_of(module, path)]


def _ours(target: str) -> bool:
    return target.split(".")[0] == "glm53"


def test_every_package_has_its_place_in_the_order() -> None:
    packages = {package_of(module) for module in MODULES}
    assert packages <= set(ALLOWED), f"place these in ALLOWED (and docs/architecture.md): {packages - set(ALLOWED)}"
    assert {"recipe", "preflight", "plan", "serve", "cli"} <= packages


def test_every_import_between_packages_follows_the_flow_order() -> None:
    wrong = [
        f"{found.module}:{found.line} imports {found.target} ({package_of(found.module)} -> {package_of(found.target)})"
        for found in ALL_IMPORTS
        if _ours(found.target)
        and package_of(found.module) != package_of(found.target)
        and package_of(found.target) not in ALLOWED.get(package_of(found.module), frozenset())
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_plan_is_its_four_systems_in_their_order() -> None:
    parts = {plan_part(module) for module in MODULES} - {None}
    assert parts == set(PLAN_ALLOWED), (
        f"place these in PLAN_ALLOWED (and docs/architecture.md): {parts ^ set(PLAN_ALLOWED)}"
    )
    wrong = [
        f"{found.module}:{found.line} imports {found.target} ({plan_part(found.module)} -> {plan_part(found.target)})"
        for found in ALL_IMPORTS
        if (source := plan_part(found.module)) is not None
        and (target := plan_part(found.target)) is not None
        and source != target
        and target not in PLAN_ALLOWED[source]
    ]
    assert not wrong, "imports against plan's order:\n" + "\n".join(wrong)


def _module_of(target: str) -> str | None:
    """The module of glm53 an import reaches: itself, or the package a name was imported from."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted: a cycle lies inside each."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycle_not_even_a_type_only_one() -> None:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for found in ALL_IMPORTS:
        target = _module_of(found.target) if _ours(found.target) else None
        # A package's __init__ importing its own modules is how a package is read, not a cycle of its modules.
        if target is not None and target != found.module and found.module != target.rpartition(".")[0]:
            graph[found.module].add(target)
    assert import_cycles(graph) == [], "import cycles (break each by moving the shared name down a layer)"


def test_the_cycle_finder_finds_what_it_is_for() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_function_imports_a_module_of_glm53() -> None:
    inside = [f"{f.module}:{f.line} imports {f.target}" for f in ALL_IMPORTS if f.in_function and _ours(f.target)]
    assert not inside, "imports of glm53 inside functions (import at module level):\n" + "\n".join(inside)


def test_an_import_inside_a_function_is_a_heavy_or_optional_dependency_that_says_so() -> None:
    inside = [found for found in ALL_IMPORTS if found.in_function and not _ours(found.target)]
    standard = [f"{f.module}:{f.line} {f.target}" for f in inside if f.target.split(".")[0] in sys.stdlib_module_names]
    silent = [f"{f.module}:{f.line} {f.target}" for f in inside if not f.commented]
    assert not standard, "the standard library is never heavy: import it at module level:\n" + "\n".join(standard)
    assert not silent, "say why with `# heavy: ...` or `# optional: ...`:\n" + "\n".join(silent)


def test_no_import_hides_in_a_call() -> None:
    """`__import__` and `importlib.import_module` would let a module of glm53 in past the tests above."""
    calls = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in ("__import__", "import_module"):
                    calls.append(f"{module}:{node.lineno}")
    assert not calls, "dynamic imports:\n" + "\n".join(calls)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from . import doctor\n", "glm53.preflight", ["glm53.preflight.doctor"]),
        ("from .doctor import run_checks\n", "glm53.preflight.render", ["glm53.preflight.doctor"]),
        ("from .. import errors\n", "glm53.plan.finite", ["glm53.errors"]),
        ("from .. import __version__\n", "glm53.plan.finite", ["glm53"]),
        ("from ..host import facts\n", "glm53.plan.finite", ["glm53.host"]),
    ],
)
def test_relative_imports_are_resolved(source: str, module: str, expected: list[str]) -> None:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _resolve(module, module == "glm53.preflight", node) == expected


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text(
        "import glm53.serve.launch\n"
        "def f():\n"
        "    from glm53.host import facts\n"
        "    import numpy\n"
        "    # heavy: torch\n"
        "    import torch\n"
        "    import torch.cuda\n"
        "    import vllm  # optional: the engine\n"
    )
    found = {(i.target, i.in_function, i.commented) for i in imports_of("glm53.host.probe", path)}
    assert found == {
        ("glm53.serve.launch", False, False),
        ("glm53.host", True, False),
        ("numpy", True, False),
        ("torch", True, True),
        ("torch.cuda", True, True),
        ("vllm", True, True),
    }
    assert "serve" not in ALLOWED["host"]


# `hint`, `missing_hint`, `hint_text`; not a type hint (`get_type_hints`, `hints` of a signature).
_HINT = re.compile(r"(?:^|_)hint(?:_|$)")


def test_one_name_per_concept() -> None:
    """No two public classes of the package share a name (one Target, one Plan), and the fix an error offers is
    called `fix` everywhere (never `hint`)."""
    defined: dict[str, list[str]] = {}
    hint_names: list[str] = []
    for module, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(module)
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        hint_names += [
            f"{module}:{t.start[0]} {t.string}" for t in tokens if t.type == tokenize.NAME and _HINT.search(t.string)
        ]
    twins = {name: modules for name, modules in defined.items() if len(modules) > 1}
    assert twins == {}, "one class name, one concept: rename one of each"
    assert hint_names == [], "call the fix a message offers `fix`"
