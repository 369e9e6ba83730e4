"""An environment's tools over MCP, end to end on loopback with the official ``mcp`` client.

A real ``example_session_state_mgmt`` server (a per-rollout counter) runs on its own socket with
``expose_tools_over_mcp: true``; ``streamable_http_client`` + ``ClientSession`` list and call its
tools. The counter shows the session mapping: state persists within one MCP session, is isolated
between two, an MCP session can adopt a rollout seeded over HTTP (and verified over HTTP), and the
rollout is released when the MCP session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
import pytest

from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.sessions import SESSION_COOKIE
from polygym.testing import synthetic_response
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt

mcp = pytest.importorskip("mcp")
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

pytestmark = pytest.mark.e2e


@contextlib.asynccontextmanager
async def serving(
    expose: bool, idle_timeout_s: float = 900.0
) -> AsyncIterator[tuple[ExampleSessionStateMgmt, str]]:
    config = {"expose_tools_over_mcp": expose, "session_idle_timeout_s": idle_timeout_s}
    env = ExampleSessionStateMgmt("counter", config)
    server = AppServer(env.app, bind_socket())
    await server.start()
    try:
        yield env, server.url
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def mcp_session(url: str, cookie: str | None = None) -> AsyncIterator[mcp.ClientSession]:
    """An MCP client session; with ``cookie``, its requests carry that rollout's session cookie."""
    headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"} if cookie else None
    async with (
        httpx.AsyncClient(headers=headers) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        mcp.ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: mcp.ClientSession, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    result = await session.call_tool(name, arguments)
    return result.isError, orjson.loads(result.content[0].text)


async def post(url: str, path: str, body: Any, cookie: str | None = None) -> tuple[int, Any, str | None]:
    cookies = {SESSION_COOKIE: cookie} if cookie else {}
    async with (
        aiohttp.ClientSession(cookies=cookies) as http,
        http.post(f"{url}{path}", data=orjson.dumps(body)) as reply,
    ):
        seeded = reply.cookies.get(SESSION_COOKIE)
        return reply.status, orjson.loads(await reply.read()), seeded.value if seeded else None


async def wait_for(condition: Any, deadline_s: float = 10.0) -> None:
    """Poll ``condition()`` until it holds (the server ends a session after the client's DELETE)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_tools_listed_with_the_http_schemas_and_called_with_the_http_results() -> None:
    async with serving(expose=True) as (_, url), mcp_session(url) as session:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/tools") as reply:
            http_tools = orjson.loads(await reply.read())
        listed = (await session.list_tools()).tools
        assert [(t.name, t.description, t.inputSchema) for t in listed] == [
            (t["name"], t["description"], t["parameters"]) for t in http_tools
        ]
        # polygym's own tools and NeMo Gym's same-named server's (increment_counter, get_counter_value)
        both = {"increment", "get_value", "increment_counter", "get_counter_value"}
        assert {t.name for t in listed} == both

        result = await session.call_tool("increment", {"amount": 5})
        assert not result.isError
        assert result.structuredContent == {"value": 5}
        http_status, http_body, _ = await post(url, "/increment", {"amount": 5})
        assert (http_status, orjson.loads(result.content[0].text)) == (200, http_body)

        # Bad arguments get the environment's own 422 body, as over HTTP, and change nothing.
        is_error, body = await call(session, "increment", {"amount": "5"})
        http_status, http_body, _ = await post(url, "/increment", {"amount": "5"})
        assert (is_error, body) == (True, http_body) and http_status == 422
        assert body["error"]["type"] == "validation_error"
        assert await call(session, "get_value", {}) == (False, {"value": 5})

        # Only @tool methods are tools: verify and seed_session cannot be reached over MCP.
        for name in ("verify", "seed_session", "end_session"):
            is_error, body = await call(session, name, {})
            assert is_error and body["error"]["type"] == "unknown_tool"


async def test_state_persists_within_an_mcp_session_and_is_isolated_between_two() -> None:
    async with serving(expose=True) as (env, url):
        async with mcp_session(url) as first, mcp_session(url) as second:
            assert env.sessions.stats()["active"] == 2
            assert await call(first, "increment", {"amount": 3}) == (False, {"value": 3})
            assert await call(first, "increment", {"amount": 4}) == (False, {"value": 7})
            assert await call(second, "get_value", {}) == (False, {"value": 0})
            assert await call(second, "increment", {"amount": -2}) == (False, {"value": -2})
            assert await call(first, "get_value", {}) == (False, {"value": 7})
        # Closing each client ends its MCP session, which releases its rollout session.
        await wait_for(lambda: env.sessions.stats()["active"] == 0)
        assert env.sessions.stats()["released"] == 2


async def test_an_mcp_session_adopts_a_rollout_seeded_over_http_and_releases_it_at_the_end() -> None:
    row = {"responses_create_params": {"input": "Add 3."}, "initial_value": 10, "expected_final_value": 13}
    async with serving(expose=True) as (env, url):
        status, _, cookie = await post(url, "/seed_session", row)
        assert status == 200 and cookie is not None
        async with mcp_session(url, cookie) as session:
            assert await call(session, "get_value", {}) == (False, {"value": 10})
            assert await call(session, "increment", {"amount": 3}) == (False, {"value": 13})
            # A second MCP session may not hold the same rollout (the first to end would release it).
            async with (
                aiohttp.ClientSession(cookies={SESSION_COOKIE: cookie}) as http,
                http.post(f"{url}/mcp", data=b"{}") as reply,
            ):
                assert reply.status == 409
            # The harness verifies over HTTP, in the same rollout, before closing the MCP session.
            answer = synthetic_response("Final value: 13")
            status, verified, _ = await post(url, "/verify", {**row, "response": answer}, cookie)
            assert status == 200, verified
            assert verified["value_source"] == "session"
            assert (verified["final_value"], verified["reward"]) == (13, 1.0)
        await wait_for(lambda: env.sessions.get(cookie) is None)
        status, body, _ = await post(url, "/verify", {**row, "response": answer}, cookie)
        assert status == 409 and body["error"]["type"] == "unknown_session"


async def test_an_idle_mcp_session_ends_and_releases_its_rollout() -> None:
    """A client that vanishes without its DELETE (no open stream, no request) loses its session."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with serving(expose=True, idle_timeout_s=1.5) as (env, url), aiohttp.ClientSession() as http:
        async with http.post(f"{url}/mcp", data=orjson.dumps(initialize), headers=headers) as reply:
            assert reply.status == 200
            mcp_session_id = reply.headers["mcp-session-id"]
            await reply.read()
        assert env.sessions.stats()["active"] == 1
        await wait_for(lambda: env.sessions.stats()["active"] == 0)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        headers["mcp-session-id"] = mcp_session_id
        async with http.post(f"{url}/mcp", data=orjson.dumps(ping), headers=headers) as reply:
            assert reply.status == 404  # the MCP session is gone too, not only its rollout


async def test_an_unknown_session_cookie_is_refused_at_initialize() -> None:
    async with (
        serving(expose=True) as (env, url),
        aiohttp.ClientSession(cookies={SESSION_COOKIE: "0" * 32}) as http,
        http.post(f"{url}/mcp", data=b"{}") as reply,
    ):
        assert reply.status == 409
        assert "unknown or expired session" in (await reply.json())["error"]["message"]
        assert env.sessions.stats()["active"] == 0


async def test_the_mcp_body_is_bounded_like_every_route() -> None:
    async with serving(expose=True) as (_, url):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}\r\n\r\n{{".encode()
        )
        await writer.drain()
        status_line = await reader.readline()
        writer.close()
        assert status_line.split()[1] == b"413"


async def test_without_the_flag_there_is_no_mcp_route() -> None:
    async with serving(expose=False) as (env, url), aiohttp.ClientSession() as http:
        for method in ("GET", "POST", "DELETE"):
            async with http.request(method, f"{url}/mcp", data=b"{}") as reply:
                assert reply.status == 404
        assert not env.config.expose_tools_over_mcp


def test_the_core_never_imports_mcp_without_the_flag() -> None:
    code = (
        "import sys\nfrom resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt\n"
        "ExampleSessionStateMgmt('counter', {}).app\n"
        "assert 'mcp' not in sys.modules, 'mcp imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
