"""Calling polygym servers by name, with timeouts, retries and cookie pass-through.

Every caller in the stack (agents, the collector, ``gym env status``) only knows server *names*;
the head server's registry maps them to addresses. A name hosted in the caller's own process is
called in-process (see ``asgi_transport``); anything else goes through one shared connection pool
sized to the caller's concurrency (unlimited by default), so no hidden limit sits below it: the
lean HTTP/1.1 client of ``http1`` for plain ``http://`` (every polygym server, a local model
server), an aiohttp session, imported only then, for the rest (TLS to a hosted API).

Every failure comes out as a ``ServerCallError`` whose ``error_class`` names what really happened
(``polygym.net.failure``): a callee's class from its failure header, else the transport's own
(timeout, refused, reset mid-reply, reply too large, bad JSON), read from the builtin exception
both transports raise (``ConnectionRefusedError``, ``ConnectionError``, ``TimeoutError``).
Retries share the call chain's budget (``polygym.net.budget``), and every body read is bounded
(``polygym.net.body_limit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any

import orjson

from polygym.net import budget, failure
from polygym.net.asgi_transport import ASGIApp, Handoff, asgi_request, in_own_context
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES, ResponseTooLarge, read_limited
from polygym.net.http1 import Http1Pool, plain_target
from polygym.net.replicas import Replicas
from polygym.net.retry import RetryPolicy
from polygym.redact import redact_text
from polygym.suggest import unknown_name_message

if TYPE_CHECKING:
    import aiohttp

DEFAULT_TIMEOUT_S = 300.0
KEEPALIVE_S = 15.0
Dispatch = Callable[
    [str, str, bytes, dict[str, str]],
    Awaitable[tuple[int, list[tuple[bytes, bytes]], bytes] | Handoff | None],
]
JSON_HEADERS = {"content-type": "application/json"}
DEFAULT_RETRY = RetryPolicy()


class ServerCallError(Exception):
    """A call that failed for good: after retries, or with a non-transient error status.

    ``status`` is None when no HTTP status came back (connection refused, reset, timeout);
    ``error_class`` names the failure for ``_failures.jsonl``: one of ``polygym.net.failure``'s
    classes (``Timeout``, ``RateLimited``, ...), or ``HTTP <status>`` for a callee's own error.

    The target and message are redacted (``polygym.redact``): they end up in logs, replies and
    ``_failures.jsonl``, and an upstream URL may carry a password.
    """

    def __init__(self, target: str, message: str, status: int | None = None, error_class: str = "") -> None:
        target, message = redact_text(target), redact_text(message)
        super().__init__(f"{target}: {message}")
        self.target = target
        self.status = status
        self.error_class = error_class or (f"HTTP {status}" if status else "ConnectionError")
        self.detail = message


class UnknownServerError(ServerCallError):
    """The name is not in the registry."""


class Reply:
    """One HTTP reply; ``headers`` have lower-case names, ``source`` names the call in errors.

    A reply from a server in this process may carry its JSON value itself (``Handoff``): ``json()``
    returns it without parsing, and ``body`` is encoded from it only when someone reads it.
    """

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        cookies: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        source: str = "",
        handoff: Handoff | None = None,
    ) -> None:
        self.status = status
        self.cookies = cookies or {}
        self.headers = headers or {}
        self.source = source
        self._body = body if handoff is None else None
        self._handoff = handoff
        self._handed = False

    @property
    def body(self) -> bytes:
        if self._body is None:
            assert self._handoff is not None
            self._body = orjson.dumps(self._handoff.value)
        return self._body

    def json(self) -> Any:
        """The parsed body; a body that is not JSON is a ``BadJSON`` ServerCallError, so it is
        recorded as what it is instead of as a crash of whoever read it. A handed-off value is
        returned the first time as it came (the caller's own from then on), later parsed from
        ``body`` as any reply is."""
        if self._handoff is not None and not self._handed:
            self._handed = True
            return self._handoff.value
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError as exc:
            raise ServerCallError(
                self.source or "reply",
                f"reply is not valid JSON ({exc}); it starts {self.body[:200]!r}",
                self.status,
                failure.BAD_JSON,
            ) from None

    def json_object(self) -> dict[str, Any]:
        """The parsed body, which must be a JSON object: an empty body, a list or a scalar where an
        object was promised (a model's Response, say) is a ``BadJSON`` ServerCallError naming what
        came, not an ``AttributeError`` in whoever reads a field of it."""
        value = self.json()
        if isinstance(value, dict):
            return value
        what = "an empty body" if not self.body else f"JSON {type(value).__name__}, not an object"
        raise ServerCallError(
            self.source or "reply",
            f"reply is {what}; it starts {self.body[:200]!r}",
            self.status,
            failure.BAD_JSON,
        )

    @property
    def error_class(self) -> str:
        """The class of this reply as a failure: the callee's own when it sent one."""
        return failure.failure_class(self.headers) or f"HTTP {self.status}"


def _json_headers(cookies: dict[str, str] | None) -> dict[str, str]:
    """Headers of a JSON request to a server, with the session cookies it is to see."""
    headers = {"content-type": "application/json"}
    if cookies:
        headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    return headers


def _asgi_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` as an in-process ASGI app receives them."""
    return [(name.encode(), value.encode()) for name, value in headers.items()]


def _header_dict(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in headers}


def _cookies_from_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The cookies set by ``headers``; the parser is built only when one is set (most replies of
    an in-process call, a model turn relayed, set none)."""
    set_cookies = [value for key, value in headers if key.lower() == b"set-cookie"]
    if not set_cookies:
        return {}
    jar: SimpleCookie = SimpleCookie()
    for value in set_cookies:
        jar.load(value.decode("latin-1"))
    return {k: m.value for k, m in jar.items()}


def error_detail(body: bytes, limit: int = 2000) -> str:
    """The most useful part of an error body: our servers' ``error.message``, else the text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:limit]
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return f"{err.get('type', 'error')}: {err.get('message', '')}"[:limit]
    return body.decode("utf-8", "replace")[:limit]


def registry_from_instances(instances: Any) -> list[dict[str, Any]]:
    """NeMo Gym's ``/server_instances`` as polygym registry entries.

    Each instance names its server ``process_name``, its kind ``server_type`` and its
    implementation ``name``; one without an address (a process NeMo Gym has not placed) cannot be
    called and is left out.
    """
    entries = []
    for instance in instances if isinstance(instances, list) else ():
        url = instance.get("url") if isinstance(instance, dict) else None
        if not isinstance(url, str) or not instance.get("process_name"):
            continue
        entries.append(
            {
                "name": instance["process_name"],
                "kind": instance.get("server_type"),
                "implementation": instance.get("name"),
                "url": url,
                "pid": instance.get("pid"),
            }
        )
    return entries


HEAD_REGISTRY_ROUTES: tuple[tuple[str, Callable[[Any], list[dict[str, Any]]]], ...] = (
    ("/servers", lambda entries: entries),
    ("/server_instances", registry_from_instances),
)
"""Where a head lists its servers, asked in order: polygym's route, then NeMo Gym's."""


class ServerClient:
    """Name-resolving JSON client shared by everything in one process."""

    def __init__(
        self,
        head_url: str | None = None,
        pool_size: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ):
        """``pool_size``: connections at most (0: no limit, aiohttp's ``limit=0``);
        ``max_body_bytes``: the largest reply body read, inflated (see ``body_limit``)."""
        self.head_url = head_url.rstrip("/") if head_url else None
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._local: dict[str, ASGIApp] = {}
        self._dispatch: dict[str, Dispatch] = {}
        self._addresses: dict[str, str] = {}
        self._replicas = Replicas()
        self._lookup: asyncio.Future[None] | None = None
        """The head lookup in flight, shared by every caller that needs one meanwhile."""
        self._pool: Http1Pool | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- name resolution -------------------------------------------------------------------
    def add_local(self, name: str, app: ASGIApp, dispatch: Dispatch | None = None) -> None:
        """Route calls to ``name`` straight into ``app`` (same process, no socket).

        ``dispatch`` (a server's ``dispatch`` method) serves JSON routes without going through
        the ASGI stack at all; routes it declines still go through ``app``.
        """
        self._local[name] = app
        if dispatch is not None:
            self._dispatch[name] = dispatch

    def set_address(self, name: str, url: str) -> None:
        self._addresses[name] = url.rstrip("/")
        self._replicas.set(name, [self._addresses[name]])

    async def servers(self) -> list[dict[str, Any]]:
        """The head server's registry: one dict per running server (``name``, ``kind``, ``url`` ...).

        A polygym head answers ``GET /servers``. NeMo Gym's head (``ng_run`` / its ``gym env
        start``) has no such route; it lists its servers at ``GET /server_instances`` under other
        keys, read through ``registry_from_instances``, so polygym's collector joins NeMo Gym's
        own stack by its head URL just as it joins a polygym one.
        """
        if self.head_url is None:
            return [{"name": n, "url": u} for n, u in self._addresses.items()]
        for route, read in HEAD_REGISTRY_ROUTES:
            reply = await self.request_url("GET", f"{self.head_url}{route}", retry=RetryPolicy(attempts=3))
            if reply.status == 404:
                continue
            if reply.status != 200:
                raise ServerCallError("head", f"GET {route} returned {reply.status}", reply.status)
            return read(reply.json())
        routes = " or ".join(f"GET {route}" for route, _ in HEAD_REGISTRY_ROUTES)
        raise ServerCallError(
            "head",
            f"{self.head_url} answers neither {routes} (404): it is not the head server of a "
            "polygym or NeMo Gym stack (check the head URL and port)",
            404,
        )

    async def resolve(self, name: str, refresh: bool = False) -> str:
        """URL of server ``name``; asks the head server when unknown or when ``refresh``."""
        if name in self._addresses and not refresh:
            return self._addresses[name]
        if self.head_url is not None:
            await self._look_up()
        if name not in self._addresses:
            raise UnknownServerError(
                name, unknown_name_message("server", name, self._addresses), None, "UnknownServer"
            )
        return self._addresses[name]

    async def _look_up(self) -> None:
        """Learn every address from the head, one lookup at a time.

        Callers that need a lookup while one is in flight wait for that one: a collector with
        10,000 rollouts in flight that loses an address (a replica refused a connection) would
        otherwise send 10,000 ``GET /servers``, queued in the pool behind the rollouts' own
        calls, and the head's resets of that burst became rollout failures. Shielded, so a caller
        that is cancelled does not cancel the lookup the others wait for.
        """
        if self._lookup is None or self._lookup.done():
            self._lookup = asyncio.ensure_future(self._read_registry())
            # read even when every waiter was cancelled: no "exception never retrieved" in the log
            self._lookup.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(self._lookup)

    async def _read_registry(self) -> None:
        by_name: dict[str, list[str]] = {}
        for entry in await self.servers():
            by_name.setdefault(entry["name"], []).append(entry["url"].rstrip("/"))
        for known, urls in by_name.items():
            self._addresses[known] = urls[0]
            self._replicas.set(known, urls)

    # -- calls -------------------------------------------------------------------------------
    async def call(
        self,
        name: str,
        path: str,
        payload: Any = None,
        *,
        cookies: dict[str, str] | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        method: str = "POST",
    ) -> Reply:
        """Call ``path`` on server ``name``; raises ServerCallError unless the status is 2xx.

        The call carries what is left of the chain's budget to the callee (``budget``).
        """
        body = b"" if payload is None else orjson.dumps(payload)
        target = f"{name} {path}"
        reply = await self._with_retries(
            target,
            lambda left: self._send(name, method, path, body, cookies, left),
            retry,
            timeout_s or self.timeout_s,
        )
        reply.source = target
        if not 200 <= reply.status < 300:
            raise ServerCallError(target, error_detail(reply.body), reply.status, reply.error_class)
        return reply

    @staticmethod
    async def _with_retries(
        target: str,
        send: Callable[[budget.CallBudget], Awaitable[Reply]],
        retry: RetryPolicy,
        timeout_s: float,
    ) -> Reply:
        """The one retry loop: ``send`` again after a failed connection or a transient status, with
        the policy's backoff (or the callee's ``Retry-After``), within the chain's budget; returns
        the last reply, whatever its status.

        ``timeout_s`` bounds the whole call, retries and waits included, and the chain's deadline
        bounds it further: an attempt gets the time left, and a wait that would pass the deadline
        ends the loop with the reply in hand. A timeout is not retried (the callee may still be
        working on it), nor a reply that is too large (it would be again), nor a failure the callee
        marked final (it already spent the chain's retries). ``send`` gets the budget left for
        that attempt, to hand on to the callee.
        """
        caller = budget.current()
        call = caller.narrowed(retry.attempts, timeout_s)
        attempts, deadline = call.attempts or 1, call.deadline or 0.0
        # The limit that applies, as the user set it: read before any time passes, so a 0.2 s
        # timeout is reported as 0.2 s, not as whatever a loaded machine left of it.
        allowed_s = min(timeout_s, caller.remaining_s())
        for attempt in range(1, attempts + 1):
            left = budget.CallBudget(attempts=attempts - attempt + 1, deadline=deadline)
            if left.remaining_s() <= 0:
                raise ServerCallError(target, "no time left in the caller's deadline", None, failure.TIMEOUT)
            try:
                reply = await send(left)
            except TimeoutError:
                message = f"no reply within {allowed_s:.3g}s"
                raise ServerCallError(target, message, None, failure.TIMEOUT) from None
            except ResponseTooLarge as exc:
                raise ServerCallError(target, str(exc), None, failure.RESPONSE_TOO_LARGE) from None
            except ConnectionRefusedError as exc:
                error = ServerCallError(target, f"connection failed: {exc}", None, failure.CONNECTION_REFUSED)
                if attempt == attempts or not await budget.pause(retry.delay(attempt), deadline):
                    raise error from exc
                continue
            except ConnectionError as exc:
                error = ServerCallError(
                    target,
                    f"connection broke: {str(exc) or type(exc).__name__}",
                    None,
                    failure.CONNECTION_RESET,
                )
                if not retry.retry_after_send or attempt == attempts:
                    raise error from exc
                if not await budget.pause(retry.delay(attempt), deadline):
                    raise error from exc
                continue
            final = failure.failure_class(reply.headers) is not None
            if final or not retry.should_retry_status(reply.status) or attempt == attempts:
                return reply
            if not await budget.pause(retry.delay(attempt, reply.headers.get("retry-after")), deadline):
                return reply
        raise AssertionError("RetryPolicy.attempts must be at least 1")

    async def _send(
        self,
        name: str,
        method: str,
        path: str,
        body: bytes,
        cookies: dict[str, str] | None,
        left: budget.CallBudget,
    ) -> Reply:
        timeout_s = left.remaining_s()
        if name in self._local:
            async with asyncio.timeout(timeout_s):
                served = await in_own_context(self._serve_local(name, method, path, body, cookies, left))
            if isinstance(served, Handoff):
                return Reply(200, cookies=served.cookies, headers=JSON_HEADERS, handoff=served)
            return Reply(served[0], served[2], _cookies_from_headers(served[1]), _header_dict(served[1]))
        await self.resolve(name, refresh=self._replicas.look_again(name))
        url = self._replicas.pick(name, cookies)
        headers = _json_headers(cookies)
        headers.update(left.headers())
        with self._replicas.outstanding(url):
            try:
                reply = await self._http(method, url + path, body, headers, timeout_s)
            except ConnectionRefusedError:
                # Dead, or back at another address: the next attempt tries another replica, and
                # asks the head again (``Replicas.look_again``).
                self._replicas.refused(url)
                raise
        self._replicas.remember(url, reply.cookies)
        return reply

    async def _serve_local(
        self,
        name: str,
        method: str,
        path: str,
        body: bytes,
        cookies: dict[str, str] | None,
        left: budget.CallBudget,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | Handoff:
        """A call to a server in this process, inside the budget left (this runs in a task of its
        own, so the budget is the callee's only): its ``dispatch`` serves JSON routes, its app the rest."""
        with budget.within(left):
            dispatch = self._dispatch.get(name)
            served = await dispatch(method, path, body, cookies or {}) if dispatch is not None else None
            if served is not None:
                return served
            headers = _asgi_headers(_json_headers(cookies))
            return await asgi_request(self._local[name], method, path, body, headers)

    async def request_url(
        self,
        method: str,
        url: str,
        payload: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> Reply:
        """Call an absolute URL (an upstream model API, the head server); returns any status.

        Transient statuses and connection errors are retried; the final reply is returned as is
        so that proxies can pass upstream errors back with their status and body. The chain's
        budget bounds the retries but is not sent: the other end is not a polygym server.
        """
        body = b"" if payload is None else orjson.dumps(payload)
        all_headers = {"content-type": "application/json", **(headers or {})}
        reply = await self._with_retries(
            url,
            lambda left: self._http(method, url, body, all_headers, left.remaining_s()),
            retry,
            timeout_s or self.timeout_s,
        )
        reply.source = url
        return reply

    async def _http(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> Reply:
        target = plain_target(url)
        if target is None:
            return await self._aiohttp(method, url, body, headers, timeout_s)
        status, raw, data = await self._http_pool().request(method, target, body, headers, timeout_s)
        return Reply(status, data, _cookies_from_headers(raw), _header_dict(raw))

    def _http_pool(self) -> Http1Pool:
        """The pool of plain-HTTP connections. Idle ones are dropped sooner than polygym servers
        drop them (``KEEPALIVE_S`` < uvicorn's 30 s in ``listen``): a request sent on a connection
        the server is closing at that moment is cut, and a tool call cut that way is not sent again."""
        if self._pool is None:
            self._pool = Http1Pool(self.pool_size, KEEPALIVE_S, self.max_body_bytes)
        return self._pool

    async def _aiohttp(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> Reply:
        """A call ``http1`` does not make (TLS, credentials in the URL), through aiohttp, whose
        failures are translated to the builtin exceptions the retry loop classifies."""
        import aiohttp

        session = self._http_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with session.request(
                method, url, data=body or None, headers=headers, timeout=timeout
            ) as resp:
                data = await read_limited(resp, self.max_body_bytes)
                cookies = {k: m.value for k, m in resp.cookies.items()}
                return Reply(resp.status, data, cookies, {k.lower(): v for k, v in resp.headers.items()})
        except TimeoutError:
            raise
        except aiohttp.ClientConnectorError as exc:
            raise ConnectionRefusedError(str(exc)) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionResetError(str(exc) or type(exc).__name__) from exc

    def _http_session(self) -> aiohttp.ClientSession:
        """The aiohttp session, pooled as ``_http_pool`` is."""
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.pool_size, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None
