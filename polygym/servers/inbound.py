"""What every request into a polygym server goes through before its handler (an ASGI middleware).

Guarantees a handler cannot give itself:

* **Only this machine's callers.** Requests a web page could make (a foreign ``Host`` after DNS
  rebinding, a foreign ``Origin``, a form or ``text/plain`` body) are refused before the body is
  read (``polygym.servers.cross_site``).
* **Bounded request bodies.** A request is read in full before the handler runs (all polygym
  routes are JSON), and one declaring or sending more than ``max_body_bytes`` is answered 413 at
  once; an unbounded read would let any client exhaust the server's memory. The prompt routes
  (``PROMPT_PATHS``) take at most ``max_prompt_body_bytes`` (32 MiB, Anthropic's own request
  limit), and the whole body must arrive within ``body_read_timeout_s`` (408), so a client that
  declares 200 MB and sends 10 bytes does not hold the request open.
* **Bounded parsing.** JSON of tiny containers becomes up to 30 times its size in Python objects
  (``[{},{},...]``: 96 MB took a model server to 3 GiB). Before any object is built, the body's
  parsed size is estimated from counts of its structural bytes (``parsed_size_estimate``, an upper
  bound) and a body that could grow past ``MAX_PARSED_RATIO`` times its size is refused (413).
  Nesting is bounded by orjson itself (1,024 levels).
* **A caller that goes away stops the work.** uvicorn keeps running a handler whose client has
  disconnected; it only drops what the handler sends. A collector that gives up on a rollout
  (``--timeout``, Ctrl-C) would leave its agent calling the model and the tools for minutes, with
  the environment's session held. Here the handler runs as a task while the connection is
  watched; on ``http.disconnect`` before the response is complete the task is cancelled, so the
  agent's ``finally`` releases the session and no further model or tool call starts.

A path under NeMo Gym's rollout prefix (``/ng-rollout/<id>/v1/responses``) is served as the route
it ends with (``polygym.servers.rollout_path``).

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
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType

from polygym.net.asgi_transport import ASGIApp, Message, Receive, Scope, Send
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES
from polygym.servers.cross_site import CrossSitePolicy, Refusal
from polygym.servers.rollout_path import without_rollout_prefix

PROMPT_PATHS = frozenset({"/v1/responses", "/v1/chat/completions", "/v1/messages", "/run"})
"""Routes that take one conversation or one row: far smaller than a batch of rollouts."""
DEFAULT_MAX_PROMPT_BODY_BYTES = 32 * 1024 * 1024
BODY_READ_TIMEOUT_S = 60.0
"""Far above the time a 256 MiB body takes over any network a stack runs on."""
MAX_PARSED_RATIO = 20
"""Measured (parsed / body bytes): rows of messages 3x, token-id arrays 6-7x, arrays of small ints
(estimated 19x, the densest legitimate shape) 4x; refused: ``{}``, ``[]`` and ``{"a":1}`` arrays (21-24x)."""
_PARSED_SLACK_BYTES = 1024 * 1024
_WEIGHTS = ((b"{", 192), (b"[", 72), (b",", 36), (b'"', 13))
_HEAVIEST = max(weight for _, weight in _WEIGHTS)
_NOT_STRUCTURE = bytes(byte for byte in range(256) if bytes([byte]) not in {c for c, _ in _WEIGHTS})

DirectRoute = Callable[[Scope, Receive, Send], Awaitable[None]]
"""A route served without the router: an ASGI callable for one (method, path)."""


class InFlight:
    """How many requests a server is serving right now, over HTTP and in-process together.

    ``with in_flight.serving():`` counts one request for the block. The object is its own context
    manager (``serving`` returns it): it is entered on every request and every in-process call,
    where a generator-based one costs several times more.
    """

    def __init__(self) -> None:
        self.count = 0

    def serving(self) -> InFlight:
        return self

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
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
        max_prompt_body_bytes: int = DEFAULT_MAX_PROMPT_BODY_BYTES,
        body_read_timeout_s: float = BODY_READ_TIMEOUT_S,
        cross_site: CrossSitePolicy | None = None,
    ) -> None:
        """``direct``: the routes served without ``app``'s router, by (method, path);
        ``cross_site``: the hosts and origins served (default: ``CrossSitePolicy.from_env()``)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_prompt_body_bytes = min(max_prompt_body_bytes, max_body_bytes)
        self.body_read_timeout_s = body_read_timeout_s
        self.cross_site = cross_site or CrossSitePolicy.from_env()
        self.in_flight = in_flight or InFlight()
        self.direct = direct or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = without_rollout_prefix(scope)
        body, refusal = b"", self.cross_site.refusal(scope)
        if refusal is None:
            body, refusal = await self._bounded_body(scope, receive)
        if refusal is not None:
            await refusal.send(send)
            return
        if is_ping(scope):
            await self._serve_until_disconnect(scope, body, receive, send)
            return
        with self.in_flight.serving():
            await self._serve_until_disconnect(scope, body, receive, send)

    async def _bounded_body(self, scope: Scope, receive: Receive) -> tuple[bytes, Refusal | None]:
        """The request body, or why it is refused: too large, too slow, or parsing to too much."""
        limit = self.max_prompt_body_bytes if scope["path"] in PROMPT_PATHS else self.max_body_bytes
        try:
            async with asyncio.timeout(self.body_read_timeout_s):
                body = await self._read_body(scope, receive, limit)
        except TimeoutError:
            message = f"request body not received within {self.body_read_timeout_s:g}s"
            return b"", Refusal(408, "request_timeout", message)
        if body is None:
            return b"", Refusal(413, "request_too_large", f"request body over {limit} bytes")
        if could_amplify(body):
            message = (
                f"request body of {len(body)} bytes could parse to more than {MAX_PARSED_RATIO} times "
                "its size (too many small objects)"
            )
            return b"", Refusal(413, "request_too_complex", message)
        return body, None

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> bytes | None:
        """The request body, or None once it is over ``limit`` (declared or sent)."""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length" and value.isdigit() and int(value) > limit:
                return None
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b""  # the client left before sending its body; the handler sees a disconnect
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
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


def parsed_size_estimate(body: bytes) -> int:
    """An upper bound on the bytes of the Python objects ``body`` parses to, as JSON, from counts
    of its structural bytes (no object is built). Each ``{`` is a dict of up to 5 keys (192 bytes
    with its slot), each ``[`` a list (72), each ``,`` a value's slot and an int or float object
    (36), each ``"`` half of what a string adds to that (13), plus the text itself. Bytes inside
    strings are counted too: that only overestimates. One ``translate`` keeps the structural bytes,
    so the counts scan only those."""
    structure = body.translate(None, _NOT_STRUCTURE)
    return len(body) + sum(weight * structure.count(char) for char, weight in _WEIGHTS)


def could_amplify(body: bytes) -> bool:
    """Whether ``body`` could parse to more than ``MAX_PARSED_RATIO`` times its size (and the
    slack); a body too short for even all-``{`` to get there is not scanned."""
    if len(body) * (_HEAVIEST + 1 - MAX_PARSED_RATIO) <= _PARSED_SLACK_BYTES:
        return False
    return parsed_size_estimate(body) > MAX_PARSED_RATIO * len(body) + _PARSED_SLACK_BYTES
