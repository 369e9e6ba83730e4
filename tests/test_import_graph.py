"""No module of ``polygym`` imports, even inside a function, a module that imports it back.

A loop works only while every import in it stays lazy, and breaks the day someone moves one to
the top of its file; the errors module exists so that none is needed (it broke the only one,
``stack.config`` <-> ``stack.catalog``).
"""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "polygym"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The polygym modules ``path`` imports anywhere in its body (``from a import b`` may name a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            }
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def test_no_import_loop() -> None:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {name: _imports(path, modules) - {name, "polygym"} for name, path in paths.items()}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the loop
