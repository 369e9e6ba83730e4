"""Serving an ASGI app on a socket we bound ourselves.

Why bind first: probing for a free port and binding later races with every other process on the
machine (two ``gym env start`` at once). Binding port 0 — or the requested port — and handing the
bound socket to uvicorn gives the real address with no window for a collision.
Why a uvicorn subclass: ``uvicorn.Server.serve`` installs process-wide signal handlers, which
breaks running several servers in one event loop (the inline backend) and fights the launcher's
own Ctrl-C handling. Signals belong to the launcher; servers are stopped by ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


class PortInUseError(OSError):
    """The requested fixed port is taken by another process."""


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """Bind and listen on ``host:port`` (0 = any free port); raises PortInUseError if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Small JSON replies must not wait for Nagle's algorithm (~40 ms per reused connection);
    # accepted connections inherit the option.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(exc.errno, f"port {port} on {host} is already in use") from exc
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class _QuietServer(uvicorn.Server):
    """uvicorn without process-wide signal handlers (see module docstring)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AppServer:
    """One ASGI app served on one pre-bound socket inside the current event loop."""

    def __init__(self, app: Any, sock: socket.socket, graceful_timeout_s: float = 2.0) -> None:
        self.sock = sock
        self.url = socket_url(sock)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=math.ceil(graceful_timeout_s),
            timeout_keep_alive=30,
            backlog=2048,
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start serving; returns once the app's startup (lifespan) has finished."""
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self.sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise the startup failure
                raise RuntimeError(f"server on {self.url} exited during startup")
            await asyncio.sleep(0.005)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await self._task
