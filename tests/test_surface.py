"""The public surface: ``from polygym import ...`` gives every exported name, lazily, and the server
folders are written with it, ``polygym.testing`` and (by kind) ``polygym.metrics``/``polygym.models``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest

import polygym
import polygym.models
import polygym.testing
from tests.conftest import ROOT

INIT = Path(polygym.__file__)
PUBLIC = {
    "resources_servers": {"polygym", "polygym.testing", "polygym.metrics"},
    "responses_api_agents": {"polygym", "polygym.testing"},
    "responses_api_models": {"polygym", "polygym.testing", "polygym.models"},
}
"""The modules a server folder of each kind may import (the import contract in pyproject.toml says
the same for the packages import-linter sees; this also covers ``data/generate.py`` scripts)."""


def type_checking_imports() -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in polygym/__init__.py (what type checkers see)."""
    tree = ast.parse(INIT.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {alias.name for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_every_exported_name_resolves_and_type_checkers_see_the_same_names() -> None:
    assert set(polygym.__all__) == type_checking_imports()
    for name in polygym.__all__:
        value = getattr(polygym, name)
        assert value is getattr(importlib.import_module(polygym._HOME[name]), name)
        assert getattr(value, "__name__", name) == name  # functions and classes under their own names
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


@pytest.mark.parametrize("facade", [polygym.testing, polygym.models])
def test_every_name_of_a_facade_resolves(facade: ModuleType) -> None:
    assert [name for name in facade.__all__ if not hasattr(facade, name)] == []


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def _imported_modules(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The polygym modules an import names (``from polygym import testing`` names ``polygym.testing``)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name.split(".")[0] == "polygym"}
    if node.module is None or node.module.split(".")[0] != "polygym":
        return set()
    return {
        f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
        for a in node.names
    }


def private_imports(paths: Iterable[Path], kind: str) -> list[str]:
    """``file:line: module`` for every import of a polygym module a server folder of ``kind`` may not
    use; an app (any file outside ``tests/``) may not import ``polygym.testing`` either."""
    offenders = []
    for path in paths:
        allowed = PUBLIC[kind] - (set() if path.parent.name == "tests" else {"polygym.testing"})
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                offenders += [f"{path}:{node.lineno}: {m}" for m in sorted(_imported_modules(node) - allowed)]
    return offenders


@pytest.mark.parametrize("kind", sorted(PUBLIC))
def test_server_folders_import_only_the_public_modules(kind: str) -> None:
    assert private_imports(sorted((ROOT / kind).rglob("*.py")), kind) == []


def test_shipped_servers_take_surface_names_from_polygym() -> None:
    """No server imports a surface name from the module behind it."""
    offenders = []
    for path in sorted(ROOT.glob("responses_api_*/*/app.py")) + sorted(
        ROOT.glob("resources_servers/*/app.py")
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "polygym":
                surface = [a.name for a in node.names if a.name in polygym.__all__]
                offenders += [f"{path.parent.name}: {name} from {node.module}" for name in surface]
    assert offenders == []
