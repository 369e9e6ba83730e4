"""The lean HTTP/1.1 client: which URLs it takes, keep-alive reuse, framing, refused headers.

Bounds, failures and retries through it are tested with the rest of the client (``test_client``,
``test_body_limit``): every test there calls a plain ``http://`` loopback URL, which is its path.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from polygym.net import failure
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.http1 import MAX_HEAD_BYTES, Http1Pool, Target, plain_target
from polygym.net.retry import RetryPolicy

MiB = 1 << 20


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://127.0.0.1:8000/v1/responses",
            Target("127.0.0.1", 8000, b"127.0.0.1:8000", b"/v1/responses"),
        ),
        ("http://localhost/a?b=1#frag", Target("localhost", 80, b"localhost", b"/a?b=1")),
        ("http://h:1", Target("h", 1, b"h:1", b"/")),
        ("http://h?x=1", Target("h", 80, b"h", b"/?x=1")),
        ("http://[::1]:9/x", Target("::1", 9, b"[::1]:9", b"/x")),
        ("https://api.example.com/v1", None),
        ("http://user:secret@h/v1", None),
        ("http://h/a b", None),
        ("http://h/caf\u00e9", None),
        ("http://h:99999/", None),
        ("http://h:x/", None),
        ("http:///path", None),
    ],
)
def test_plain_target_takes_only_what_needs_no_tls_credentials_or_quoting(
    url: str, expected: Target | None
) -> None:
    assert plain_target(url) == expected


class KeepAliveServer:
    """Answers every request on a connection with the next scripted reply; counts connections."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = replies
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                answer = self.replies[min(len(self.requests), len(self.replies)) - 1]
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer or b"Content-Length" not in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[KeepAliveServer]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()


def _ok(body: bytes = b'{"ok": true}', *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def _three_calls(server: KeepAliveServer, keepalive_s: float = 15.0) -> list[bytes]:
    pool = Http1Pool(limit=0, keepalive_s=keepalive_s, max_body_bytes=MiB)
    target = plain_target(server.url + "/x")
    assert target is not None
    try:
        return [(await pool.request("POST", target, b"{}", {}, 5.0))[2] for _ in range(3)]
    finally:
        pool.close()


async def test_a_kept_alive_connection_is_used_again() -> None:
    async with KeepAliveServer([_ok()]).running() as server:
        bodies = await _three_calls(server)
    assert bodies == [b'{"ok": true}'] * 3
    assert server.connections == 1


async def test_a_reply_that_closes_its_connection_is_not_used_again() -> None:
    async with KeepAliveServer([_ok(b"{}", b"Connection: close")]).running() as server:
        await _three_calls(server)
    assert server.connections == 3


async def test_an_idle_connection_past_the_keepalive_is_dropped() -> None:
    async with KeepAliveServer([_ok()]).running() as server:
        await _three_calls(server, keepalive_s=0.0)
    assert server.connections == 3


async def test_a_body_delimited_by_the_end_of_the_connection_is_read_whole() -> None:
    async with KeepAliveServer(
        [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"]
    ).running() as server:
        bodies = await _three_calls(server)
    assert bodies == [b"all of it"] * 3


async def test_an_informational_reply_is_passed_over() -> None:
    async with KeepAliveServer([b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"[1]")]).running() as server:
        bodies = await _three_calls(server)
    assert bodies == [b"[1]"] * 3


async def test_a_gzip_reply_is_inflated_and_its_headers_and_cookies_read() -> None:
    packed = gzip.compress(b'{"n": 1}')
    answer = _ok(packed, b"Content-Encoding: gzip", b"Set-Cookie: sid=abc; Path=/", b"X-Thing: Yes")
    async with KeepAliveServer([answer]).running() as server:
        client = ServerClient()
        try:
            got = await client.request_url(
                "POST", server.url + "/x", {"a": 1}, headers={"authorization": "Bearer k"}
            )
        finally:
            await client.close()
    assert (got.status, got.json(), got.cookies) == (200, {"n": 1}, {"sid": "abc"})
    assert got.headers["x-thing"] == "Yes"
    sent = server.requests[0]
    assert sent.startswith(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nauthorization: Bearer k\r\n" in sent and sent.endswith(b'\r\n\r\n{"a":1}')


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with KeepAliveServer([_ok()]).running() as server:
        client = ServerClient()
        try:
            with pytest.raises(ValueError, match="line breaks"):
                await client.request_url("POST", server.url + "/x", {}, headers={"x": "a\r\nInjected: 1"})
        finally:
            await client.close()
    assert server.requests == []


async def test_a_head_that_never_ends_is_cut_at_its_bound() -> None:
    endless = b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (2 * MAX_HEAD_BYTES)
    async with KeepAliveServer([endless]).running() as server:
        pool = Http1Pool(limit=0, keepalive_s=15.0, max_body_bytes=MiB)
        target = plain_target(server.url + "/x")
        assert target is not None
        try:
            with pytest.raises(ConnectionResetError, match="headers pass"):
                await pool.request("GET", target, b"", {}, 5.0)
        finally:
            pool.close()


async def test_a_url_this_client_does_not_take_goes_through_aiohttp_with_the_same_failures() -> None:
    """Credentials in the URL (as TLS) are aiohttp's: the call still works, sends them as Basic
    auth, and a refused connection there is classed as the plain path classes it."""
    async with KeepAliveServer([_ok()]).running() as server:
        client = ServerClient(None)
        try:
            url = server.url.replace("http://", "http://user:secret@") + "/x"
            reply = await client.request_url("POST", url, {"a": 1})
            assert reply.status == 200 and reply.json() == {"ok": True}
            assert b"Authorization: Basic dXNlcjpzZWNyZXQ=" in server.requests[0]
        finally:
            await client.close()
    client = ServerClient(None)
    try:
        with pytest.raises(ServerCallError) as refused:
            await client.request_url("GET", url, retry=RetryPolicy(attempts=1))
        assert refused.value.error_class == failure.CONNECTION_REFUSED
    finally:
        await client.close()
