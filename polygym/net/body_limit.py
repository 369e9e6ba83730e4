"""Reading a reply body with a bound on its size, compressed and inflated.

A model API (or anything at the other end of a socket) can answer with a body of any size, and a
small gzip body can inflate a thousandfold: 10 MB on the wire became 1 GiB in memory before this
bound existed. ``read_limited`` (an aiohttp reply; ``http1`` bounds its own replies the same way)
refuses a declared ``Content-Length`` over the limit before reading a byte, then counts the decoded
bytes as they stream (aiohttp inflates incrementally, so memory stays near the limit) and stops at
the limit with ``ResponseTooLarge``. An uncompressed body with a declared length is read in one go:
aiohttp reads exactly that many bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Default bound on one body: far above a long multi-turn rollout with token ids, far below a
machine's memory."""
_CHUNK = 256 * 1024


class ResponseTooLarge(Exception):
    """A body over the limit; ``size`` is the declared or counted size when the read stopped."""

    def __init__(self, size: int, limit: int, declared: bool) -> None:
        what = "declares" if declared else "reached"
        super().__init__(f"reply body {what} {size} bytes (decoded); the limit is {limit} bytes")
        self.size = size
        self.limit = limit


async def read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole (decoded) body of ``resp``, or ResponseTooLarge once it passes ``limit`` bytes."""
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise ResponseTooLarge(declared, limit, declared=True)
    if declared is not None and resp.headers.get("content-encoding", "identity") == "identity":
        return await resp.read()  # the body is exactly the declared bytes: nothing to count
    chunks: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_chunked(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise ResponseTooLarge(total, limit, declared=False)
        chunks.append(chunk)
    return b"".join(chunks)
