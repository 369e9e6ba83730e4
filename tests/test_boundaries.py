"""The core never imports a server folder: implementations depend on polygym, not the reverse.

(The loader imports implementations by path at run time; that is configuration, not a dependency.)
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

SERVER_FOLDERS = ("resources_servers", "responses_api_agents", "responses_api_models")


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_polygym_imports_no_server_folder() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "polygym").rglob("*.py"))
        for module in imported_modules(ast.parse(path.read_text()))
        if module.split(".")[0] in SERVER_FOLDERS
    ]
    assert offenders == []
