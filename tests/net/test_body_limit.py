"""Every reply body read is bounded, compressed and inflated, with a clear ResponseTooLarge."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from polygym.net.client import ServerCallError, ServerClient
from polygym.net.retry import RetryPolicy
from tests.net.fake_upstream import FakeUpstream, chunked, declares, gzip_bomb, reply

MiB = 1 << 20
RETRY = RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.01)


async def test_a_gzip_bomb_stops_at_the_limit_with_memory_bounded() -> None:
    """64 MiB of zeros in ~64 KiB of gzip; the read stops at 1 MiB and memory stays near it."""
    async with FakeUpstream([gzip_bomb(64 * MiB)]) as upstream:
        client = ServerClient(max_body_bytes=MiB)
        tracemalloc.start()
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.request_url("POST", upstream.url + "/v1/responses", {}, retry=RETRY)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await client.close()
    assert caught.value.error_class == "ResponseTooLarge"
    assert f"the limit is {MiB} bytes" in caught.value.detail
    assert peak < 16 * MiB, f"peak {peak / MiB:.1f} MiB while reading a body capped at 1 MiB"
    assert len(upstream.requests) == 1  # the same request would get the same reply: not retried


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    """The upstream declares 10 GB and sends nothing: the client must not wait for it."""
    async with FakeUpstream([declares(10 * 1024 * MiB)]) as upstream:
        client = ServerClient(max_body_bytes=MiB)
        try:
            with pytest.raises(ServerCallError) as caught:
                await asyncio.wait_for(
                    client.request_url("POST", upstream.url + "/x", {}, timeout_s=30, retry=RETRY), 10
                )
        finally:
            await client.close()
    assert caught.value.error_class == "ResponseTooLarge"
    assert "declares 10737418240 bytes" in caught.value.detail


async def test_a_body_without_a_declared_length_stops_at_the_limit() -> None:
    async with FakeUpstream([chunked(32 * MiB)]) as upstream:
        client = ServerClient(max_body_bytes=MiB)
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.request_url("POST", upstream.url + "/x", {}, retry=RETRY)
        finally:
            await client.close()
    assert caught.value.error_class == "ResponseTooLarge"
    assert "reply body reached" in caught.value.detail


async def test_a_body_within_the_limit_is_read_whole() -> None:
    body = b'{"text": "' + b"a" * (MiB - 20) + b'"}'
    async with FakeUpstream([reply(200, body)]) as upstream:
        client = ServerClient(max_body_bytes=MiB)
        try:
            got = await client.request_url("POST", upstream.url + "/x", {})
        finally:
            await client.close()
    assert got.body == body
