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

It also counts the requests in flight (``InFlight``), which a server reports on ``GET /`` so that
``gym env status`` shows the load of every replica.

**JSON routes skip the router.** A request to one of the server's JSON routes (``direct``, the same
table in-process callers use) goes straight to its endpoint, with a Starlette ``Request`` on the
same scope and the same response object. Routing, Starlette's exception middleware and their
wrappers of ``send`` cost about as much as the handler of a model call (profiled on the
benchmark's model endpoint), and a JSON endpoint catches its handler's exceptions itself.
Everything else (``GET /``, mounts, routes with path parameters) goes through the app.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping

import orjson

from polygym.net.asgi_transport import ASGIApp, Message, Receive, Scope, Send
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES

DirectRoute = Callable[[Scope, Receive, Send], Awaitable[None]]
"""A route served without the router: an ASGI callable for one (method, path)."""


class InFlight:
    """How many requests a server is serving right now, over HTTP and in-process together."""

    def __init__(self) -> None:
        self.count = 0

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


def is_ping(scope: Scope) -> bool:
    """A liveness ping (``GET /``) is not load: counting it would make every probe see itself."""
    return scope.get("method") == "GET" and scope.get("path") == "/"


class InboundGuard:
    """Wraps an ASGI app; non-HTTP scopes (lifespan) pass through untouched."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        in_flight: InFlight | None = None,
        direct: Mapping[tuple[str, str], DirectRoute] | None = None,
    ) -> None:
        """``direct``: the routes served without ``app``'s router, by (method, path)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.in_flight = in_flight or InFlight()
        self.direct = direct or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive)
        if body is None:
            await _too_large(send, self.max_body_bytes)
            return
        if is_ping(scope):
            await self._serve_until_disconnect(scope, body, receive, send)
            return
        with self.in_flight.serving():
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
        """Serve in this task while a watcher task waits for the client to leave; if it leaves
        before the response is complete, this task is cancelled, and that cancellation ends here.

        One extra task per request, not two: the handler keeps the request's own task.
        """
        exchange = _Exchange(body, send)
        serving = asyncio.current_task()
        assert serving is not None
        watcher = asyncio.ensure_future(exchange.cancel_on_disconnect(receive, serving))
        app = self.direct.get((scope["method"], scope["path"])) if not scope.get("root_path") else None
        try:
            await (app or self.app)(scope, exchange.receive, exchange.send)
        except asyncio.CancelledError:
            if not exchange.left or serving.cancelling() > 1:  # cancelled by someone else too
                raise
            serving.uncancel()
        finally:
            watcher.cancel()


class _Exchange:
    """One request as the app sees it: the body read up front, then a wait for the client to go."""

    def __init__(self, body: bytes, send: Send) -> None:
        self._body: bytes | None = body
        self._send = send
        self._gone = asyncio.Event()
        self.completed = False
        self.left = False
        """The client went away before the response was complete."""

    async def receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.completed = True
        await self._send(message)

    async def cancel_on_disconnect(self, receive: Receive, serving: asyncio.Task[object]) -> None:
        await _wait_disconnect(receive)
        if not self.completed:
            self.left = True
            self._gone.set()
            serving.cancel()


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
