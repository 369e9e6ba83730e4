"""Calling polygym servers by name, with timeouts, retries and cookie pass-through.

Every caller in the stack (agents, the collector, ``gym env status``) only knows server *names*;
the head server's registry maps them to addresses. A name hosted in the caller's own process is
called in-process (see ``asgi_transport``); anything else goes through one shared aiohttp session
whose connection pool is sized to the caller's concurrency, so no hidden limit sits below it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import orjson

from polygym.net.asgi_transport import ASGIApp, asgi_request, in_own_context
from polygym.net.retry import RetryPolicy
from polygym.suggest import unknown_name_message

DEFAULT_TIMEOUT_S = 300.0
Dispatch = Callable[
    [str, str, bytes, dict[str, str]], Awaitable[tuple[int, list[tuple[bytes, bytes]], bytes] | None]
]
DEFAULT_RETRY = RetryPolicy()


class ServerCallError(Exception):
    """A call that failed for good: after retries, or with a non-transient error status.

    ``status`` is None when no HTTP status came back (connection refused, reset, timeout);
    ``error_class`` names the failure for ``_failures.jsonl`` (e.g. ``HTTP 500``, ``Timeout``).
    """

    def __init__(self, target: str, message: str, status: int | None = None, error_class: str = "") -> None:
        super().__init__(f"{target}: {message}")
        self.target = target
        self.status = status
        self.error_class = error_class or (f"HTTP {status}" if status else "ConnectionError")
        self.detail = message


class UnknownServerError(ServerCallError):
    """The name is not in the registry."""


@dataclass
class Reply:
    status: int
    body: bytes
    cookies: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


def _json_headers(cookies: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    """Headers of a JSON request to a server, with the session cookies it is to see."""
    headers = [(b"content-type", b"application/json")]
    if cookies:
        headers.append((b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode()))
    return headers


def _cookies_from_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for key, value in headers:
        if key.lower() == b"set-cookie":
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


class ServerClient:
    """Name-resolving JSON client shared by everything in one process."""

    def __init__(
        self, head_url: str | None = None, pool_size: int = 1024, timeout_s: float = DEFAULT_TIMEOUT_S
    ):
        self.head_url = head_url.rstrip("/") if head_url else None
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self._local: dict[str, ASGIApp] = {}
        self._dispatch: dict[str, Dispatch] = {}
        self._addresses: dict[str, str] = {}
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

    async def servers(self) -> list[dict[str, Any]]:
        """The head server's registry: one dict per running server."""
        if self.head_url is None:
            return [{"name": n, "url": u} for n, u in self._addresses.items()]
        reply = await self.request_url("GET", f"{self.head_url}/servers", retry=RetryPolicy(attempts=3))
        if reply.status != 200:
            raise ServerCallError("head", f"GET /servers returned {reply.status}", reply.status)
        return reply.json()

    async def resolve(self, name: str, refresh: bool = False) -> str:
        """URL of server ``name``; asks the head server when unknown or when ``refresh``."""
        if name in self._addresses and not refresh:
            return self._addresses[name]
        if self.head_url is not None:
            for entry in await self.servers():
                self._addresses[entry["name"]] = entry["url"].rstrip("/")
        if name not in self._addresses:
            raise UnknownServerError(
                name, unknown_name_message("server", name, self._addresses), None, "UnknownServer"
            )
        return self._addresses[name]

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
        """Call ``path`` on server ``name``; raises ServerCallError unless the status is 2xx."""
        body = b"" if payload is None else orjson.dumps(payload)
        timeout = timeout_s or self.timeout_s
        reply = await self._with_retries(
            f"{name} {path}",
            lambda: self._send(name, method, path, body, cookies, timeout),
            retry,
            timeout,
            on_connection_error=lambda: self._addresses.pop(name, None),  # it may come back on another port
        )
        if not 200 <= reply.status < 300:
            raise ServerCallError(f"{name} {path}", error_detail(reply.body), reply.status)
        return reply

    @staticmethod
    async def _with_retries(
        target: str,
        send: Callable[[], Awaitable[Reply]],
        retry: RetryPolicy,
        timeout_s: float,
        on_connection_error: Callable[[], object] | None = None,
    ) -> Reply:
        """The one retry loop: ``send`` again after a failed connection or a transient status, with
        the policy's backoff, up to its attempts; returns the last reply, whatever its status.

        A timeout is not retried: the callee may still be working on the request, and every
        retry would wait the whole timeout again.
        """
        for attempt in range(1, retry.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(retry.delay(attempt - 1))
            try:
                reply = await send()
            except TimeoutError:
                raise ServerCallError(target, f"no reply within {timeout_s:g}s", None, "Timeout") from None
            except (aiohttp.ClientConnectionError, ConnectionError) as exc:
                if on_connection_error is not None:
                    on_connection_error()
                if attempt < retry.attempts:
                    continue
                error = ServerCallError(target, f"connection failed: {exc}", None, type(exc).__name__)
                raise error from exc
            if not retry.should_retry_status(reply.status) or attempt == retry.attempts:
                return reply
        raise AssertionError("RetryPolicy.attempts must be at least 1")

    async def _send(
        self, name: str, method: str, path: str, body: bytes, cookies: dict[str, str] | None, timeout_s: float
    ) -> Reply:
        if name in self._local:
            async with asyncio.timeout(timeout_s):
                served = await in_own_context(self._serve_local(name, method, path, body, cookies))
            return Reply(served[0], served[2], _cookies_from_headers(served[1]))
        url = await self.resolve(name)
        headers = {k.decode(): v.decode() for k, v in _json_headers(cookies)}
        return await self._http(method, url + path, body, headers, timeout_s)

    async def _serve_local(
        self, name: str, method: str, path: str, body: bytes, cookies: dict[str, str] | None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A call to a server in this process: its ``dispatch`` serves JSON routes, its app the rest."""
        dispatch = self._dispatch.get(name)
        served = await dispatch(method, path, body, cookies or {}) if dispatch is not None else None
        if served is not None:
            return served
        return await asgi_request(self._local[name], method, path, body, _json_headers(cookies))

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
        so that proxies can pass upstream errors back with their status and body.
        """
        body = b"" if payload is None else orjson.dumps(payload)
        all_headers = {"content-type": "application/json", **(headers or {})}
        timeout = timeout_s or self.timeout_s
        return await self._with_retries(
            url, lambda: self._http(method, url, body, all_headers, timeout), retry, timeout
        )

    async def _http(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> Reply:
        session = self._http_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.request(method, url, data=body or None, headers=headers, timeout=timeout) as resp:
            data = await resp.read()
            cookies = {k: m.value for k, m in resp.cookies.items()}
            return Reply(resp.status, data, cookies)

    def _http_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.pool_size, limit_per_host=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
