"""MCP sessions are bounded: past ``max_mcp_sessions`` open at once, a new one is refused (503)."""

from __future__ import annotations

import contextlib

import httpx
import orjson
import pytest

from polygym.net.listen import AppServer, bind_socket
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt

mcp = pytest.importorskip("mcp")
from tests.e2e.test_mcp_e2e import call, mcp_session, wait_for  # noqa: E402

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_a_session_past_the_cap_is_refused_until_one_ends() -> None:
    env = ExampleSessionStateMgmt("counter", {"expose_tools_over_mcp": True, "max_mcp_sessions": 2})
    server = AppServer(env.app, bind_socket())
    await server.start()
    try:
        async with contextlib.AsyncExitStack() as open_sessions:
            first = await open_sessions.enter_async_context(mcp_session(server.url))
            await open_sessions.enter_async_context(mcp_session(server.url))
            async with httpx.AsyncClient() as http:
                refused = await http.post(
                    f"{server.url}/mcp", content=orjson.dumps(INITIALIZE), headers=HEADERS
                )
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "too_many_sessions"
            assert "2 MCP sessions are open (max_mcp_sessions)" in refused.json()["error"]["message"]
            assert await call(first, "increment", {"amount": 1}) == (
                False,
                {"value": 1},
            )  # open ones still work
        await wait_for(lambda: env.sessions.stats()["active"] == 0)
        async with mcp_session(server.url) as again:
            assert await call(again, "get_value", {}) == (False, {"value": 0})
    finally:
        await server.stop()


def test_the_default_cap_is_set_and_a_cap_below_one_is_a_config_error() -> None:
    assert ExampleSessionStateMgmt("counter", {}).config.max_mcp_sessions == 1024
    with pytest.raises(ValueError, match="max_mcp_sessions"):
        ExampleSessionStateMgmt("counter", {"max_mcp_sessions": 0})
