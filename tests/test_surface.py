"""The authoring surface: ``from polygym import ...`` gives every exported name, lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import polygym
from tests.conftest import ROOT

INIT = Path(polygym.__file__)


def type_checking_imports() -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in polygym/__init__.py (what type checkers see)."""
    tree = ast.parse(INIT.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {alias.name for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_every_exported_name_resolves_and_type_checkers_see_the_same_names() -> None:
    assert set(polygym.__all__) == type_checking_imports()
    for name in polygym.__all__:
        value = getattr(polygym, name)
        assert value.__name__ == name
    assert set(polygym.__all__) <= set(dir(polygym))


def test_import_polygym_stays_cheap() -> None:
    heavy = ["starlette", "aiohttp", "pydantic", "polygym.servers.base"]
    code = f"import sys, polygym; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert loaded.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        polygym.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no attribute 'NoSuchThing'" in str(exc)
    else:
        raise AssertionError("expected an AttributeError")


def test_shipped_environments_are_written_with_the_surface() -> None:
    """No environment imports a surface name from the module behind it."""
    offenders = []
    for path in sorted(ROOT.glob("resources_servers/*/app.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "polygym":
                surface = [a.name for a in node.names if a.name in polygym.__all__]
                offenders += [f"{path.parent.name}: {name} from {node.module}" for name in surface]
    assert offenders == []
