#!/usr/bin/env python3
"""The package's module count and lines, and the longest function of each package (sub-packages of plan,
preflight and serve on their own), read with `ast`: the numbers a layout change is judged by.

    python3 tools/longest-functions.py [SRC]        (default: python/src)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def main() -> int:
    source = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "python" / "src")
    package = source / "glm53"
    modules = sorted(package.rglob("*.py"))
    lines = sum(len(path.read_text().splitlines()) for path in modules)
    print(f"{len(modules)} modules, {lines:,} lines")
    longest: dict[str, tuple[int, str]] = {}
    for path in modules:
        relative = path.relative_to(package)
        where = "/".join(relative.parts[:-1][:2]) or "(top)"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > longest.get(where, (0, ""))[0]:
                    longest[where] = (size, f"{relative}:{node.name}")
    for where, (size, name) in sorted(longest.items()):
        print(f"{where:20} {size:4}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
