"""The strata of polygym/ hold: the import contracts of pyproject.toml, checked by import-linter.

The contracts say each subpackage imports only the layers below it (``servers`` never imports
``stack``, ``collect`` never imports ``blend``...) and that the library never imports a server
folder: implementations depend on polygym, not the reverse (the loader imports them by path at run
time; that is configuration, not a dependency); and that a server folder imports only polygym's
public modules (``polygym``, ``polygym.testing``, ``polygym.metrics``, ``polygym.models``), so the
internals can move without breaking an environment. Running them here makes the README's test
command check them, not only CI.
"""

from __future__ import annotations

import os

import pytest
from importlinter.cli import lint_imports

from tests.conftest import ROOT


def test_import_contracts_are_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    status = lint_imports(config_filename=os.fspath(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "3 kept, 0 broken" in report
