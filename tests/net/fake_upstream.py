"""A misbehaving upstream on a real loopback socket, for tests of what the client does with it.

A Starlette app cannot cut a reply in the middle or send a gzip bomb, so this speaks HTTP/1.1 by
hand on an ``asyncio`` server: each request gets the next scripted answer (the last one repeats),
and every request is recorded, so a test can count exactly how many reached the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def reply(status: int = 200, body: bytes = b'{"ok": true}', headers: dict[str, str] | None = None) -> Answer:
    """A whole reply."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        all_headers = {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            **(headers or {}),
        }
        writer.write(_head(status, all_headers) + body)
        await writer.drain()

    return answer


def cut_reply(declared: int = 10_000, sent: int = 100) -> Answer:
    """A 200 that promises ``declared`` bytes, sends ``sent`` of them, and drops the connection."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(declared)}))
        writer.write(b"{" + b" " * (sent - 1))
        await writer.drain()
        writer.transport.abort()

    return answer


@functools.cache
def _gzip_of_zeros(size: int) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [squeeze.compress(block) for _ in range(size >> 20)]
    return b"".join([*parts, squeeze.flush()])


def gzip_bomb(inflated: int) -> Answer:
    """A small gzip body that inflates to ``inflated`` bytes (a whole number of MiB)."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        body = _gzip_of_zeros(inflated)
        headers = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "Content-Length": str(len(body)),
        }
        writer.write(_head(200, headers) + body)
        await writer.drain()

    return answer


def chunked(total: int, chunk: int = 64 * 1024) -> Answer:
    """A body of ``total`` bytes with no declared length (chunked transfer encoding)."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
        block = f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
        for _ in range(total // chunk):
            writer.write(block)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return answer


def declares(length: int) -> Answer:
    """Headers declaring a ``length``-byte body, then nothing (a reader waiting for it would hang)."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(length)}))
        await writer.drain()
        await asyncio.Event().wait()

    return answer


def hang() -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    return answer


@dataclass
class FakeUpstream:
    answers: list[Answer]
    requests: list[Request] = field(default_factory=list)
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aenter__(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            method, path, _ = request_line.split(" ", 2)
            self.requests.append(Request(method, path, headers, body))
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            await answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
