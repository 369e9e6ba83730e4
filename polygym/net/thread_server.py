"""Serving an ASGI app from a thread with its own event loop, so that the app cannot stall its caller.

Why not serve it in the caller's loop (``AppServer`` alone): an app under test may block its event
loop (a synchronous verifier, a ``time.sleep``, a hung C call). In the caller's loop that would
also freeze the caller's timeouts, so a checker could never report the hang. Here the app gets a
daemon thread and a loop of its own; the caller talks to it over a loopback socket and bounds
every wait with ``asyncio.wait_for``, and a server that will not stop is left behind in its
daemon thread rather than blocking the caller. Used by ``gym env check`` (``polygym.authoring.check``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from polygym.net.listen import AppServer, bind_socket


class StartupError(RuntimeError):
    """The server did not start (its app's startup raised, or uvicorn exited)."""


class ThreadServer:
    """An ASGI app on a loopback socket, served from a daemon thread running its own event loop.

    uvicorn answers a failed app startup with ``sys.exit``; that SystemExit ends the thread's loop,
    and ``start`` reports it with the app's own error (read from the ASGI lifespan messages).
    ``client`` is the app's own outbound client (anything with an async ``close``): it belongs to
    the thread's loop, so ``stop`` closes it there.
    """

    def __init__(self, app: Any, client: Any = None, graceful_timeout_s: float = 0.5) -> None:
        self.loop = asyncio.new_event_loop()
        self.lifespan_errors: list[str] = []
        self.exit_code: Any = None
        self.server = AppServer(
            self._recording(app), bind_socket("127.0.0.1", 0), graceful_timeout_s=graceful_timeout_s
        )
        self.url = self.server.url
        self.client = client
        self.thread = threading.Thread(target=self._run, name="polygym-thread-server", daemon=True)

    def _recording(self, app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            async def recording_send(message: Any) -> None:
                if str(message.get("type", "")).endswith(".failed"):
                    text = str(message.get("message") or "").strip()
                    self.lifespan_errors.append(text.splitlines()[-1] if text else "")
                await send(message)

            await app(scope, receive, recording_send if scope["type"] == "lifespan" else send)

        return wrapped

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        except SystemExit as exc:  # uvicorn's exit on a failed startup: reported by start()
            self.exit_code = exc.code
            task = self.server.task
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # retrieved: reported by start(), not as a stray task error
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _in_thread(self, coro: Any, timeout_s: float) -> None:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)

    async def start(self, timeout_s: float) -> None:
        """Serve; StartupError if the app's startup failed, TimeoutError if it took over ``timeout_s``."""
        self.thread.start()
        try:
            await self._in_thread(self.server.start(), timeout_s)
        except asyncio.CancelledError:
            if self.exit_code is None and not self.lifespan_errors:
                raise  # we are being cancelled, not the server
            reason = "; ".join(e for e in self.lifespan_errors if e) or f"exit code {self.exit_code}"
            raise StartupError(f"the server's startup failed: {reason}") from None

    async def stop(self, timeout_s: float) -> None:
        """Stop serving; TimeoutError if the server does not stop (its thread is then left behind)."""

        async def shutdown() -> None:
            await self.server.stop()
            if self.client is not None:
                await self.client.close()

        if self.exit_code is not None:  # uvicorn exited: the thread is closing its loop by itself
            await asyncio.to_thread(self.thread.join, timeout_s)
        if not self.thread.is_alive():  # never started, or exited: only the socket may be held
            self.server.sock.close()
            self.loop.close()
            return
        try:
            await self._in_thread(shutdown(), timeout_s)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self.thread.join, timeout_s)
