"""Servers whose libraries come in a polygym extra say which one to install when it is missing.

``pip install polygym`` is the core only; the embedded model and the shipped environments'
libraries are extras (``[local]``, ``[envs]``). Those libraries are imported late — in worker
processes, or when a model loads — so without this check a missing one would surface as a bare
``ModuleNotFoundError`` in the first verify. ``require_extra`` looks the modules up with
``find_spec``, which imports nothing, when the server is built.
"""

from __future__ import annotations

import importlib.util


class MissingExtraError(ImportError):
    """A server needs libraries of a polygym extra that is not installed."""


def require_extra(server: str, extra: str, *modules: str) -> None:
    """Raise MissingExtraError, naming the pip command, unless every one of ``modules`` is installed."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtraError(
            f"{server} needs {', '.join(missing)}, from polygym's [{extra}] extra: "
            f"pip install 'polygym[{extra}]' (from a clone: pip install -e '.[{extra}]')"
        )
