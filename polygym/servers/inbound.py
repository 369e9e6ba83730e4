"""What every request into a polygym server goes through before its handler (an ASGI middleware).

Two guarantees a handler cannot give itself:

* **Bounded request bodies.** A request is read in full before the handler runs (all polygym
  routes are JSON), and one declaring or sending more than ``max_body_bytes`` is answered 413 at
  once; an unbounded read would let any client exhaust the server's memory.
* **A caller that goes away stops the work.** uvicorn keeps running a handler whose client has
  disconnected; it only drops what the handler sends. A collector that gives up on a rollout
  (``--timeout``, Ctrl-C) would leave its agent calling the model and the tools for minutes, with
  the environment's session held. Here the handler runs as a task while the connection is
  watched; on ``http.disconnect`` before the response is complete the task is cancelled, so the
  agent's ``finally`` releases the session and no further model or tool call starts.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson

from polygym.net.asgi_transport import ASGIApp, Message, Receive, Scope, Send
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES


class InboundGuard:
    """Wraps an ASGI app; non-HTTP scopes (lifespan) pass through untouched."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive)
        if body is None:
            await _too_large(send, self.max_body_bytes)
            return
        await self._serve_until_disconnect(scope, body, receive, send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request body, or None once it is over the limit (declared or sent)."""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                return None
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b""  # the client left before sending its body; the handler sees a disconnect
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _serve_until_disconnect(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        completed = False
        disconnected = asyncio.Event()
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def tracked_send(message: Message) -> None:
            nonlocal completed
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, replay, tracked_send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not handler.done() and not completed:
                disconnected.set()
                handler.cancel()
            await asyncio.wait({handler})
            if not handler.cancelled():
                handler.result()  # the app's own error goes on to the server's error handling
        finally:
            watcher.cancel()
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _wait_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (or the server says the exchange is over)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _too_large(send: Send, limit: int) -> None:
    body = orjson.dumps(
        {"error": {"type": "request_too_large", "message": f"request body over {limit} bytes"}}
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
