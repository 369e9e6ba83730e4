"""ServerClient: retries on transient errors only, timeouts, name resolution through the head."""

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.net import budget
from polygym.net.client import ServerCallError, ServerClient, UnknownServerError
from polygym.net.listen import AppServer, bind_socket
from polygym.net.retry import RetryPolicy
from polygym.stack.head import Registry, head_app
from tests.net.fake_upstream import FakeUpstream, cut_reply, reply

FAST = RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.01)
CURRENT = contextvars.ContextVar("current", default="caller")


def flaky_app(fail_times: int, status: int) -> tuple[Starlette, list[int]]:
    calls: list[int] = []

    async def endpoint(request: Request) -> JSONResponse:
        calls.append(1)
        if len(calls) <= fail_times:
            return JSONResponse({"error": {"type": "x", "message": "boom"}}, status_code=status)
        return JSONResponse({"ok": True, "n": len(calls)})

    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(5)
        return JSONResponse({})

    return Starlette(
        routes=[Route("/x", endpoint, methods=["POST"]), Route("/slow", slow, methods=["POST"])]
    ), calls


@pytest.mark.parametrize("in_process", [True, False])
async def test_transient_status_is_retried(in_process: bool) -> None:
    app, calls = flaky_app(2, 503)
    client = ServerClient()
    server = AppServer(app, bind_socket())
    await server.start()
    try:
        if in_process:
            client.add_local("s", app)
        else:
            client.set_address("s", server.url)
        reply = await client.call("s", "/x", {}, retry=FAST)
        assert reply.json() == {"ok": True, "n": 3}
        assert len(calls) == 3
    finally:
        await server.stop()
        await client.close()


async def test_server_error_is_not_retried() -> None:
    app, calls = flaky_app(5, 500)
    client = ServerClient()
    client.add_local("s", app)
    with pytest.raises(ServerCallError) as info:
        await client.call("s", "/x", {}, retry=FAST)
    assert info.value.status == 500 and info.value.error_class == "HTTP 500"
    assert "boom" in str(info.value)
    assert len(calls) == 1


async def test_connection_refused_fails_after_bounded_retries() -> None:
    sock = bind_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    client = ServerClient()
    client.set_address("gone", url)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(ServerCallError) as info:
        await client.call("gone", "/x", {}, retry=FAST)
    assert info.value.status is None
    assert loop.time() - began < 5
    # Kept, marked as refused: the next call asks the head (none here) again, since a restarted
    # server may listen elsewhere; a client without a head keeps the one address it was given.
    assert await client.resolve("gone") == url
    await client.close()


@pytest.mark.parametrize(("fail_times", "status", "calls_made"), [(2, 503, 3), (5, 503, 3), (5, 500, 1)])
async def test_request_url_retries_like_call_and_returns_the_last_reply(
    fail_times: int, status: int, calls_made: int
) -> None:
    """Same loop as ``call``, but the final reply comes back whatever its status (for proxies)."""
    app, calls = flaky_app(fail_times, status)
    server = AppServer(app, bind_socket())
    await server.start()
    client = ServerClient()
    try:
        reply = await client.request_url("POST", server.url + "/x", {}, retry=FAST)
        assert len(calls) == calls_made
        assert reply.status == (200 if fail_times < calls_made else status)
    finally:
        await server.stop()
        await client.close()


async def test_timeout_is_reported() -> None:
    app, _ = flaky_app(0, 200)
    client = ServerClient()
    client.add_local("s", app)
    with pytest.raises(ServerCallError) as info:
        await client.call("s", "/slow", {}, timeout_s=0.05)
    assert info.value.error_class == "Timeout"


async def test_names_resolve_through_head_registry() -> None:
    app, _ = flaky_app(0, 200)
    target = AppServer(app, bind_socket())
    registry = Registry()
    head = AppServer(head_app(registry, {"policy_api_key": "****"}, "stack-x"), bind_socket())
    await target.start()
    await head.start()
    client = ServerClient(head.url)
    try:
        registry.register(
            {"name": "policy", "kind": "resources_servers", "implementation": "x", "url": target.url}
        )
        assert (await client.call("policy", "/x", {})).json()["ok"] is True
        with pytest.raises(UnknownServerError) as info:
            await client.call("polcy", "/x", {})
        assert "unknown server 'polcy'" in str(info.value) and "Did you mean 'policy'" in str(info.value)
        config = (await client.request_url("GET", head.url + "/config")).json()
        assert config == {"policy_api_key": "****"}
    finally:
        await client.close()
        await target.stop()
        await head.stop()


async def test_in_process_calls_run_in_their_own_context() -> None:
    """As behind a socket, a handler starts from the caller's context and its changes stay its own,
    whether ``dispatch`` serves the route or the ASGI app does."""
    seen: list[str] = []

    async def endpoint(request: Request) -> JSONResponse:
        seen.append(CURRENT.get())
        CURRENT.set("app")
        return JSONResponse({})

    async def dispatch(method: str, path: str, body: bytes, cookies: dict[str, str]) -> tuple | None:
        if path != "/direct":
            return None
        seen.append(CURRENT.get())
        CURRENT.set("dispatch")
        return 200, [], b"{}"

    client = ServerClient()
    client.add_local("s", Starlette(routes=[Route("/x", endpoint, methods=["POST"])]), dispatch)
    CURRENT.set("rollout 7")
    await client.call("s", "/x", {})
    await client.call("s", "/direct", {})
    assert seen == ["rollout 7", "rollout 7"] and CURRENT.get() == "rollout 7"


# -- failure classes, resets, Retry-After and the call chain's budget (#13.6, #13.8) ----------------


async def test_a_reset_mid_body_is_retried() -> None:
    async with FakeUpstream([cut_reply(), reply(200, b'{"ok": true}')]) as upstream:
        client = ServerClient()
        try:
            got = await client.request_url("POST", upstream.url + "/x", {}, retry=FAST)
        finally:
            await client.close()
    assert got.json() == {"ok": True}
    assert len(upstream.requests) == 2


async def test_a_reset_that_persists_is_a_connection_reset_after_the_attempts() -> None:
    async with FakeUpstream([cut_reply()]) as upstream:
        client = ServerClient()
        client.set_address("s", upstream.url)
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.call("s", "/x", {}, retry=FAST)
        finally:
            await client.close()
    assert (caught.value.error_class, caught.value.status) == ("ConnectionReset", None)
    assert len(upstream.requests) == FAST.attempts


async def test_a_state_changing_call_is_not_resent_after_a_reset() -> None:
    """The request arrived (the reply was cut): sending it again could apply it twice."""
    once = RetryPolicy(attempts=3, base_delay_s=0.001, retry_after_send=False)
    async with FakeUpstream([cut_reply()]) as upstream:
        client = ServerClient()
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.request_url("POST", upstream.url + "/x", {}, retry=once)
        finally:
            await client.close()
    assert caught.value.error_class == "ConnectionReset"
    assert len(upstream.requests) == 1


async def test_a_refused_connection_is_classed_as_such() -> None:
    sock = bind_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    client = ServerClient()
    try:
        with pytest.raises(ServerCallError) as caught:
            await client.request_url("POST", url + "/x", {}, retry=FAST)
    finally:
        await client.close()
    assert caught.value.error_class == "ConnectionRefused"


async def test_the_wait_before_a_retry_follows_retry_after() -> None:
    """FAST backs off a few ms; the upstream asks for 1 s and gets it."""
    slow_down = reply(503, b"{}", {"Retry-After": "1"})
    async with FakeUpstream([slow_down, reply(200)]) as upstream:
        client = ServerClient()
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            got = await client.request_url("POST", upstream.url + "/x", {}, retry=FAST)
        finally:
            await client.close()
    assert got.status == 200 and len(upstream.requests) == 2
    assert loop.time() - began >= 0.95


async def test_a_retry_after_past_the_deadline_ends_the_call_with_the_reply_in_hand() -> None:
    """The upstream asks for 20 s; the call has 2 s: no sleeping into a deadline it cannot meet."""
    slow_down = reply(429, b'{"error": "slow down"}', {"Retry-After": "20"})
    async with FakeUpstream([slow_down]) as upstream:
        client = ServerClient()
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            got = await client.request_url("POST", upstream.url + "/x", {}, timeout_s=2, retry=FAST)
        finally:
            await client.close()
    assert got.status == 429 and loop.time() - began < 1.5
    assert len(upstream.requests) == 1


async def test_a_failure_the_callee_marked_final_is_not_retried() -> None:
    """A polygym server already spent the chain's retries on it; its class is kept."""
    final = reply(
        502, b'{"error": {"type": "RateLimited", "message": "m"}}', {"x-polygym-failure": "RateLimited"}
    )
    async with FakeUpstream([final]) as upstream:
        client = ServerClient()
        client.set_address("agent", upstream.url)
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.call("agent", "/run", {}, retry=FAST)
        finally:
            await client.close()
    assert (caught.value.status, caught.value.error_class) == (502, "RateLimited")
    assert len(upstream.requests) == 1


async def test_an_odd_failure_header_is_ignored() -> None:
    odd = reply(500, b"{}", {"x-polygym-failure": "\x1b[31mred"})
    async with FakeUpstream([odd]) as upstream:
        client = ServerClient()
        client.set_address("s", upstream.url)
        try:
            with pytest.raises(ServerCallError) as caught:
                await client.call("s", "/x", {}, retry=FAST)
        finally:
            await client.close()
    assert caught.value.error_class == "HTTP 500"


async def test_a_reply_that_is_not_json_is_bad_json() -> None:
    async with FakeUpstream([reply(200, b"<html>oops</html>")]) as upstream:
        client = ServerClient()
        client.set_address("s", upstream.url)
        try:
            got = await client.call("s", "/x", {})
            with pytest.raises(ServerCallError) as caught:
                got.json()
        finally:
            await client.close()
    assert caught.value.error_class == "BadJSON" and "s /x" in str(caught.value)


async def test_calls_carry_what_is_left_of_the_chain_budget() -> None:
    """A call made while serving a request sends the smaller of its own and its caller's budget."""
    async with FakeUpstream([reply(503, b"{}"), reply(200)]) as upstream:
        client = ServerClient()
        client.set_address("s", upstream.url)
        try:
            with budget.within(budget.CallBudget(attempts=2, deadline=time.monotonic() + 5)):
                await client.call(
                    "s", "/x", {}, timeout_s=60, retry=RetryPolicy(attempts=4, base_delay_s=0.001)
                )
        finally:
            await client.close()
    sent = [
        (r.headers["x-polygym-attempts"], float(r.headers["x-polygym-deadline-s"])) for r in upstream.requests
    ]
    assert [attempts for attempts, _ in sent] == ["2", "1"]
    assert all(0 < seconds <= 5 for _, seconds in sent)


async def test_the_chain_budget_caps_the_attempts() -> None:
    async with FakeUpstream([reply(503, b"{}")]) as upstream:
        client = ServerClient()
        try:
            with budget.within(budget.CallBudget(attempts=2)):
                got = await client.request_url("POST", upstream.url + "/x", {}, retry=FAST)
        finally:
            await client.close()
    assert got.status == 503 and len(upstream.requests) == 2
    assert not any(
        k.startswith("x-polygym") for r in upstream.requests for k in r.headers
    )  # not a polygym server


def head_with_routes(routes: dict[str, object]) -> Starlette:
    """A head server answering only ``routes`` (path -> JSON body), 404 elsewhere."""

    def answer(body: object) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            return JSONResponse(body)

        return endpoint

    return Starlette(routes=[Route(path, answer(body), methods=["GET"]) for path, body in routes.items()])


async def test_names_resolve_through_a_nemo_gym_heads_server_instances() -> None:
    """NeMo Gym's head has no ``/servers``; its ``/server_instances`` lists the same servers."""
    instances = [
        {
            "process_name": "weather_simple_agent",
            "server_type": "responses_api_agents",
            "name": "simple_agent",
            "host": "127.0.0.1",
            "port": 7003,
            "url": "http://127.0.0.1:7003",
            "pid": 12,
        },
        {"process_name": "not_placed", "server_type": "resources_servers", "name": "x", "url": None},
    ]
    head = AppServer(head_with_routes({"/server_instances": instances}), bind_socket())
    await head.start()
    client = ServerClient(head.url)
    try:
        assert await client.servers() == [
            {
                "name": "weather_simple_agent",
                "kind": "responses_api_agents",
                "implementation": "simple_agent",
                "url": "http://127.0.0.1:7003",
                "pid": 12,
            }
        ]
        assert await client.resolve("weather_simple_agent") == "http://127.0.0.1:7003"
    finally:
        await client.close()
        await head.stop()


async def test_a_url_that_is_no_head_server_is_named_as_such() -> None:
    head = AppServer(head_with_routes({}), bind_socket())
    await head.start()
    client = ServerClient(head.url)
    try:
        with pytest.raises(ServerCallError) as info:
            await client.servers()
        message = str(info.value)
        assert "GET /servers or GET /server_instances" in message and "not the head server" in message
    finally:
        await client.close()
        await head.stop()


async def test_callers_that_need_an_address_at_once_share_one_head_lookup() -> None:
    """A thousand calls that find a name unknown together (a collector whose replica refused a
    connection) ask the head once, not a thousand times; a cancelled caller leaves the lookup to
    the others, and a name the head lacks is still an UnknownServerError for each of them."""
    lookups = 0
    release = asyncio.Event()

    async def servers(request: Request) -> JSONResponse:
        nonlocal lookups
        lookups += 1
        await release.wait()
        return JSONResponse([{"name": "env", "kind": "resources_servers", "url": "http://127.0.0.1:9"}])

    head = AppServer(Starlette(routes=[Route("/servers", servers, methods=["GET"])]), bind_socket())
    await head.start()
    client = ServerClient(head.url)
    try:
        waiting = [asyncio.ensure_future(client.resolve("env")) for _ in range(1_000)]
        unknown = asyncio.ensure_future(client.resolve("nope"))
        deadline = time.monotonic() + 10
        while lookups == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        waiting[0].cancel()
        release.set()
        urls = await asyncio.gather(*waiting[1:])
        assert urls == ["http://127.0.0.1:9"] * 999
        with pytest.raises(UnknownServerError):
            await unknown
        assert lookups == 1
        assert waiting[0].cancelled()
    finally:
        await client.close()
        await head.stop()
