"""Sessions are released on polygym's and NeMo Gym's resources servers: /end_session, /close_session."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.net.asgi_transport import asgi_request
from polygym.net.client import ServerClient
from polygym.servers.resources import ResourcesServer
from polygym.servers.session_release import CLOSE_SESSION, SessionRelease

JSON = [(b"content-type", b"application/json")]


async def seeded(server: ResourcesServer[Any]) -> list[tuple[bytes, bytes]]:
    """Headers that carry a freshly seeded session's cookie."""
    status, headers, _ = await asgi_request(server.app, "POST", "/seed_session", b"{}", JSON)
    assert status == 200
    cookie = next(v for k, v in headers if k == b"set-cookie").split(b";")[0]
    return [*JSON, (b"cookie", cookie)]


async def test_close_session_releases_the_cookies_session_in_both_of_nemo_gyms_forms() -> None:
    server = ResourcesServer("env", {})
    with_cookie = await seeded(server)
    status, _, body = await asgi_request(server.app, "POST", CLOSE_SESSION, b"{}", with_cookie)
    assert status == 200 and orjson.loads(body) == {"closed": True}
    assert server.sessions.stats() == {"active": 0, "released": 1, "expired": 0}
    status, _, body = await asgi_request(server.app, "POST", CLOSE_SESSION, b"{}", with_cookie)
    assert status == 200 and orjson.loads(body) == {"closed": True}  # closing again still succeeds

    typed = {"resources_session_id": "rs-1", "episode_id": {"rollout_id": "0-0", "attempt": 0}}
    with_cookie = await seeded(server)
    status, _, body = await asgi_request(server.app, "POST", CLOSE_SESSION, orjson.dumps(typed), with_cookie)
    assert status == 200 and orjson.loads(body) == {"resources_session_id": "rs-1"}
    assert server.sessions.stats()["active"] == 0 and server.sessions.stats()["released"] == 2


def nemo_gym_like(calls: list[tuple[str, str | None]]) -> Starlette:
    """A resources server with NeMo Gym's routes: ``/close_session``, no ``/end_session`` (404)."""

    async def close(request: Request) -> JSONResponse:
        calls.append((request.url.path, request.cookies.get("session")))
        return JSONResponse({"closed": True})

    return Starlette(routes=[Route(CLOSE_SESSION, close, methods=["POST"])])


async def test_a_server_without_end_session_is_closed_at_close_session_from_then_on() -> None:
    calls: list[tuple[str, str | None]] = []
    client = ServerClient()
    client.add_local("nemo_env", nemo_gym_like(calls))
    release = SessionRelease()
    await release(client, "nemo_env", {"session": "s1"})
    await release(client, "nemo_env", {"session": "s2"})
    assert calls == [(CLOSE_SESSION, "s1"), (CLOSE_SESSION, "s2")]
    assert release.closes_at == {"nemo_env"}


async def test_polygyms_servers_keep_end_session_and_a_release_never_raises() -> None:
    server = ResourcesServer("env", {})
    client = ServerClient()
    client.add_local("env", server.app)
    client.add_local("neither", Starlette(routes=[]))
    release = SessionRelease()
    session = server.sessions.create()
    await release(client, "env", {"polygym_session": session.id})
    assert server.sessions.stats()["released"] == 1 and release.closes_at == set()
    await release(client, "neither", {})  # 404 twice: best effort, nothing raised
    assert release.closes_at == {"neither"}


async def test_a_release_cancelled_midway_still_reaches_the_server() -> None:
    """The caller's rollout is cancelled (its collector left) while ``/end_session`` is under way:
    the caller stops waiting, and the session is released all the same."""
    server = ResourcesServer("env", {})
    arrived, go_on = asyncio.Event(), asyncio.Event()

    async def slow_end_session(scope: Any, receive: Any, send: Any) -> None:
        arrived.set()
        await go_on.wait()
        await server.app(scope, receive, send)

    client = ServerClient()
    client.add_local("env", slow_end_session)
    release = SessionRelease()
    session = server.sessions.create()
    caller = asyncio.ensure_future(release(client, "env", {"polygym_session": session.id}))
    await asyncio.wait_for(arrived.wait(), 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert server.sessions.stats()["released"] == 0
    go_on.set()
    deadline = asyncio.get_running_loop().time() + 5
    while server.sessions.stats()["released"] == 0:
        assert asyncio.get_running_loop().time() < deadline, "the cancelled release never reached the server"
        await asyncio.sleep(0.01)
    assert server.sessions.stats()["active"] == 0
