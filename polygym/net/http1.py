"""A lean HTTP/1.1 client for plain ``http://`` calls: pooled keep-alive connections, replies
parsed by httptools (the parser uvicorn serves with).

Every rollout crosses HTTP several times where the stack is not in one process: the collector's
``/run``, and each model turn relayed to its upstream. aiohttp's request machinery costs ~150 us of
CPU per call on this project's machines (its client session, request and response objects,
payload, tracing, timers), a third of the stack's CPU per rollout and a sixth of the
collector's; a request written in one piece and a reply parsed by callbacks cost ~40 us. Importing
aiohttp also costs ``gym eval run`` ~0.2 s before its first rollout (it builds two TLS contexts).

What is kept from the aiohttp session it replaces for plain HTTP: a pool per host and port with no
hidden limit below ``limit`` (0: none), idle connections dropped after ``keepalive_s``, gzip and
deflate replies inflated, every body bounded (``body_limit``: a declared length over the limit is
refused before reading, an inflated or chunked body stops at it), a timeout over the whole call.
Failures are the builtin exceptions the client's retry loop classifies: ``ConnectionRefusedError``
when no connection could be made, ``ConnectionResetError`` when one broke before the reply ended,
``TimeoutError``, ``ResponseTooLarge``. A connection is reused only after a reply read whole that
allows it; a call cancelled or failed closes its connection.

Out of scope, left to aiohttp by the caller (``plain_target`` says which): TLS, credentials in the
URL, and URLs that would need quoting. Redirects are not followed (a polygym server never sends
one, and a POST replayed elsewhere is not what a caller asked for).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
import typing
import zlib
from collections.abc import Mapping
from typing import NamedTuple

import httptools

from polygym.net.body_limit import ResponseTooLarge

Headers = list[tuple[bytes, bytes]]
_SKIPPED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Request headers this client writes itself; a caller's own would contradict them."""
_INFLATE = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
MAX_HEAD_BYTES = 64 * 1024
"""Bound on a reply's status line and headers: the parser holds a header until it ends, so an
upstream that never ends one would otherwise fill memory until the call's timeout."""


class Target(NamedTuple):
    """Where a plain ``http://`` URL points: the pool's key, the Host header, the request target."""

    host: str
    port: int
    authority: bytes
    path: bytes


@functools.lru_cache(maxsize=1024)
def plain_target(url: str) -> Target | None:
    """``url``'s target when this client can send to it: ``http://``, no credentials, and printable
    ASCII without spaces (nothing to quote); None for anything else."""
    if not url.startswith("http://") or not url.isascii() or not url.isprintable() or " " in url:
        return None
    authority, _, rest = url[len("http://") :].partition("/")
    authority, _, _ = authority.partition("#")
    authority, query_sep, query = authority.partition("?")
    if not authority or "@" in authority:
        return None
    host, port = authority, 80
    if authority.startswith("["):  # an IPv6 literal
        end = authority.find("]")
        host, tail = authority[1:end], authority[end + 1 :]
        if end < 0 or (tail and not tail.startswith(":")):
            return None
        port_text = tail[1:]
    else:
        host, _, port_text = authority.partition(":")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    path = ("/" + rest.partition("#")[0]) if not query_sep else "/?" + query
    return Target(host, port, authority.encode(), path.encode())


class _Reply(NamedTuple):
    status: int
    headers: Headers
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its reply parsed as bytes arrive."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        # Header values as aiohttp reads them: a control character in one (an upstream's odd
        # header) is the caller's to sanitize, not a broken reply.
        self._parser.set_dangerous_leniencies(lenient_headers=True)
        self._waiter: asyncio.Future[_Reply] | None = None
        self._headers: Headers = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._head_size = 0
        self._inflater: zlib._Decompress | None = None
        self._headers_done = False
        self._reusable = False

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection cannot be trusted again
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:  # a callback's own failure came first, if any
            self._fail(ConnectionResetError(f"malformed reply: {exc}"))
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionResetError("the server switched protocols"))
        if not self._headers_done:  # all of ``data`` was the head
            self._head_size += len(data)
            if self._head_size > MAX_HEAD_BYTES:
                self._fail(ConnectionResetError(f"the reply's headers pass {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._headers_done and self._reads_to_close():
            self.on_message_complete()  # a body delimited by the end of the connection
        else:
            self._fail(ConnectionResetError("the server closed the connection before the reply ended"))

    # -- httptools callbacks ------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True
        declared = self._parser.get_status_code() not in (204, 304) and self._header(b"content-length")
        if declared and declared.strip().isdigit() and int(declared) > self.limit:
            self._fail(ResponseTooLarge(int(declared), self.limit, declared=True))
            raise ConnectionAbortedError  # stops the parser before it waits for the body
        encoding = (self._header(b"content-encoding") or b"identity").strip().lower()
        if encoding in _INFLATE:
            self._inflater = zlib.decompressobj(_INFLATE[encoding])

    def on_body(self, body: bytes) -> None:
        if self._inflater is None:
            self._keep(body)
            return
        try:
            data = body
            while data and not self._done():
                self._keep(self._inflater.decompress(data, self.limit - self._size + 1))
                data = self._inflater.unconsumed_tail
        except zlib.error as exc:
            self._fail(ConnectionResetError(f"the reply's compressed body is broken: {exc}"))

    def on_message_complete(self) -> None:
        if self._done():
            return
        if 100 <= self._parser.get_status_code() < 200:  # informational: the reply comes after it
            self._headers, self._headers_done = [], False
            return
        if self._inflater is not None:
            try:
                self._keep(self._inflater.flush())
            except zlib.error as exc:
                self._fail(ConnectionResetError(f"the reply's compressed body is broken: {exc}"))
                return
        self._reusable = self._parser.should_keep_alive() and not self.closed
        assert self._waiter is not None
        self._waiter.set_result(_Reply(self._parser.get_status_code(), self._headers, b"".join(self._chunks)))

    # -- the one request ----------------------------------------------------------------------
    async def exchange(self, request: bytes) -> _Reply:
        """Send ``request`` and wait for its whole reply (the caller bounds the wait)."""
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._headers, self._chunks, self._size, self._head_size = [], [], 0, 0
        self._inflater, self._headers_done, self._reusable = None, False, False
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    @property
    def reusable(self) -> bool:
        """True when the last reply was read whole and the server keeps the connection open."""
        return self._reusable and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- helpers ------------------------------------------------------------------------------
    def _header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self._headers if key.lower() == name), None)

    def _reads_to_close(self) -> bool:
        return (
            self._header(b"content-length") is None
            and b"chunked" not in (self._header(b"transfer-encoding") or b"").lower()
        )

    def _keep(self, data: bytes) -> None:
        if not data or self._done():
            return
        self._size += len(data)
        if self._size > self.limit:
            self._fail(ResponseTooLarge(self._size, self.limit, declared=False))
            return
        self._chunks.append(data)

    def _done(self) -> bool:
        return self._waiter is None or self._waiter.done()

    def _fail(self, exc: BaseException) -> None:
        if not self._done():
            assert self._waiter is not None
            self._waiter.set_exception(exc)
        self.close()


class Http1Pool:
    """Keep-alive connections per host and port; at most ``limit`` in use at once (0: no limit)."""

    def __init__(self, limit: int, keepalive_s: float, max_body_bytes: int) -> None:
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.max_body_bytes = max_body_bytes
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots = asyncio.Semaphore(limit) if limit > 0 else None
        self.closed = False

    async def request(
        self, method: str, target: Target, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> tuple[int, Headers, bytes]:
        """One request within ``timeout_s`` (waiting for a free connection included)."""
        data = _request_bytes(method, target, body, headers)
        async with asyncio.timeout(timeout_s):
            if self._slots is None:
                return await self._exchange(target, data)
            async with self._slots:
                return await self._exchange(target, data)

    async def _exchange(self, target: Target, data: bytes) -> tuple[int, Headers, bytes]:
        conn = self._take(target) or await self._connect(target)
        try:
            reply = await conn.exchange(data)
        except BaseException:
            conn.close()
            raise
        if conn.reusable and not self.closed:
            conn.idle_since = time.monotonic()
            self._idle.setdefault((target.host, target.port), []).append(conn)
        else:
            conn.close()
        return reply

    def _take(self, target: Target) -> _Connection | None:
        """The most recently used idle connection still open and not idle too long."""
        idle = self._idle.get((target.host, target.port))
        stale_before = time.monotonic() - self.keepalive_s
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.idle_since > stale_before:
                return conn
            conn.close()
        return None

    async def _connect(self, target: Target) -> _Connection:
        if self.closed:
            raise ConnectionRefusedError("the client is closed")
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self.max_body_bytes), target.host, target.port
            )
        except OSError as exc:
            raise ConnectionRefusedError(
                f"cannot connect to {target.authority.decode()}: {exc.strerror or exc}"
            ) from exc
        return conn

    def close(self) -> None:
        self.closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _request_bytes(method: str, target: Target, body: bytes, headers: Mapping[str, str]) -> bytes:
    """The request in one piece. A header with a line break is refused: it would write a header
    (or a request) of its own."""
    lines = [f"{method} ".encode() + target.path + b" HTTP/1.1", b"Host: " + target.authority]
    for name, value in headers.items():
        if name.lower() in _SKIPPED_HEADERS:
            continue
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"header {name!r}: line breaks are not allowed in a header")
        lines.append(f"{name}: {value}".encode("latin-1"))
    lines.append(b"Accept-Encoding: gzip, deflate")
    if body or method not in ("GET", "HEAD"):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
