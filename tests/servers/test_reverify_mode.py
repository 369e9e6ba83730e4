"""NeMo Gym's ``GET /reverify_mode`` on polygym's servers that declare one (NeMo Gym's reverify asks
it before replaying stored rollouts, and stops with the 404 of a server without the route)."""

from __future__ import annotations

from polygym import ServerCallError
from polygym.testing import ENV, serve_in_process
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt
from resources_servers.example_single_tool_call.app import ExampleSingleToolCall
from resources_servers.mcqa.app import Mcqa


async def test_a_stateless_server_says_so_and_one_that_declares_nothing_has_no_route() -> None:
    for stateless in (Mcqa(ENV, {}), ExampleSingleToolCall(ENV, {})):
        async with serve_in_process(stateless) as client:
            reply = await client.call(ENV, "/reverify_mode", method="GET")
            assert (reply.status, reply.json()) == (200, "stateless")
    async with serve_in_process(ExampleSessionStateMgmt(ENV, {})) as client:
        try:
            await client.call(ENV, "/reverify_mode", method="GET")
        except ServerCallError as exc:
            assert exc.status == 404
        else:
            raise AssertionError("a server that declares no reverify_mode answered the route")
