"""Starting the viewer: index the runs, bind 127.0.0.1 on a free port, print the URL, serve.

The viewer listens on loopback only: rollouts can hold anything a model wrote or a dataset
contained, and a page over them is for the person at this machine. The socket is bound before the
URL is printed (port 0 unless ``--port``), so the printed address is the one being served.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polygym.net.listen import AppServer, bind_socket
from polygym.view import pages
from polygym.view.app import create_app
from polygym.view.index import RunIndex, open_index
from polygym.view.runs import discover

HOST = "127.0.0.1"


def open_runs(paths: Sequence[Path], echo: Callable[[str], None] = print) -> list[RunIndex]:
    """Index every run (raises ``RunNotFoundError`` naming a path that is not one)."""
    sources = [discover(path) for path in paths]
    indexes = []
    for source in sources:
        began = time.perf_counter()
        index = open_index(source)
        pages.overview(index)  # computed now, so that the first page a person opens is quick
        echo(f"{source.name}: {len(index)} rows indexed in {time.perf_counter() - began:.2f}s")
        indexes.append(index)
    if len(indexes) > 1:
        pages.comparison(indexes[0], indexes[1])
    return indexes


async def serve(indexes: list[RunIndex], port: int = 0, echo: Callable[[str], None] = print) -> None:
    """Serve until cancelled (Ctrl-C)."""
    server = AppServer(create_app(indexes), bind_socket(HOST, port))
    await server.start()
    echo(f"polygym view: {server.url}/  (read-only; Ctrl-C to stop)")
    try:
        assert server.task is not None
        await server.task
    finally:
        await server.stop()
