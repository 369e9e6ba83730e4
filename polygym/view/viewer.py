"""Starting the viewer: bind 127.0.0.1 on a free port, print the URL, serve; the runs are read after.

The viewer listens on loopback only: rollouts can hold anything a model wrote or a dataset
contained, and a page over them is for the person at this machine. The socket is bound before the
URL is printed (port 0 unless ``--port``), so the printed address is the one being served. The
URL comes first, whatever the runs' sizes: the app reads them on its worker thread and each page
shows how far that has got (``polygym.view.work``). An export has no page to wait on, so
``open_runs`` reads everything first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polygym.net.listen import AppServer, bind_socket
from polygym.view.app import create_app
from polygym.view.index import RunIndex
from polygym.view.runs import discover

HOST = "127.0.0.1"


def find_runs(paths: Sequence[Path]) -> list[RunIndex]:
    """An empty index of every run (raises ``RunNotFoundError`` naming a path that is not one)."""
    return [RunIndex(discover(path)) for path in paths]


def open_runs(paths: Sequence[Path], echo: Callable[[str], None] = print) -> list[RunIndex]:
    """Every run, read to its end now (for an export, and for tests)."""
    indexes = find_runs(paths)
    for index in indexes:
        began = time.perf_counter()
        index.refresh()
        echo(f"{index.source.name}: {len(index)} rows indexed in {time.perf_counter() - began:.2f}s")
    return indexes


async def serve(indexes: list[RunIndex], port: int = 0, echo: Callable[[str], None] = print) -> None:
    """Serve until cancelled (Ctrl-C). The server's task is shielded from that cancel: ``stop``
    then shuts it down in order (lifespan included), so Ctrl-C ends with one line, not uvicorn's
    traceback of a task torn down mid-lifespan."""
    server = AppServer(create_app(indexes), bind_socket(HOST, port))
    await server.start()
    echo(f"polygym view: {server.url}/  (read-only; Ctrl-C to stop)")
    try:
        assert server.task is not None
        await asyncio.shield(server.task)
    finally:
        await server.stop()
