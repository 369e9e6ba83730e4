"""Turning a config block into a server object: import the implementation, find its class.

An implementation folder (``<kind>/<implementation>/``) holds an entrypoint module (``app.py``)
that defines exactly one server class of the right kind. Folders inside the installed packages are
imported by dotted name so their relative imports and tests work; a user's own folder elsewhere is
imported from its file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from polygym.errors import ConfigError
from polygym.kinds import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.agent import Agent
from polygym.servers.base import BaseServer
from polygym.servers.extras import MissingExtraError
from polygym.servers.model import ModelServer
from polygym.servers.resources import ResourcesServer
from polygym.stack.server_spec import ServerSpec

BASES: dict[str, type[BaseServer]] = {
    RESOURCES_KIND: ResourcesServer,
    AGENT_KIND: Agent,
    MODEL_KIND: ModelServer,
}


def _import_entrypoint(directory: Path, entrypoint: str) -> ModuleType:
    path = (directory / entrypoint).resolve()
    if not path.is_file():
        raise ConfigError([f"{directory}: entrypoint '{entrypoint}' does not exist"])
    kind_dir = directory.resolve().parent
    package = sys.modules.get(kind_dir.name)
    package_dirs = [Path(p).resolve() for p in getattr(package, "__path__", [])]
    if kind_dir in package_dirs:
        return importlib.import_module(f"{kind_dir.name}.{directory.name}.{path.stem}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]  # two folders may share a name
    module_name = f"polygym_user_{kind_dir.name}_{directory.name}_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # a later load must show the real error again
        raise
    return module


def server_class(spec: ServerSpec) -> type[BaseServer]:
    """The one subclass of the kind's base class defined in the spec's entrypoint module."""
    for kind_package in (RESOURCES_KIND, AGENT_KIND, MODEL_KIND):
        importlib.import_module(kind_package)
    module = _import_entrypoint(spec.directory, str(spec.config.get("entrypoint") or "app.py"))
    base = BASES[spec.kind]
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == module.__name__
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise ConfigError(
            [f"{module.__file__}: expected exactly one {base.__name__} subclass, found {names}"]
        )
    return found[0]


def build_server(spec: ServerSpec, client: ServerClient) -> BaseServer:
    """Instantiate the server for ``spec``; config problems and missing extras surface as ConfigError."""
    cls = server_class(spec)
    try:
        return cls(spec.name, spec.config, client)
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        raise ConfigError([f"{spec.name} ({spec.source}): {exc}"]) from exc
    except MissingExtraError as exc:  # says which extra to install
        raise ConfigError([str(exc)]) from exc


async def serve_in_process(
    specs: list[ServerSpec], client: ServerClient, host: str
) -> list[tuple[ServerSpec, AppServer]]:
    """Build every server of ``specs`` on ``client``, then serve each on its own socket at ``host``.

    All are built and made local to ``client`` before any serves, so the calls between them stay
    in-process from the first one: what one inline stack, one ``--workers`` copy and one Ray
    actor have in common.
    """
    built = [(spec, build_server(spec, client)) for spec in specs]
    for spec, server in built:
        client.add_local(spec.name, server.app, server.dispatch)
    served = []
    for spec, server in built:
        app_server = AppServer(server.app, bind_socket(host, 0))
        await app_server.start()
        served.append((spec, app_server))
    return served
