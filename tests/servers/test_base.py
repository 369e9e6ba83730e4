"""The server bases: the config class comes from the generic parameter, stated once per subclass."""

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from pydantic import BaseModel, ValidationError
from starlette.routing import Mount, Route

from polygym import Session, tool
from polygym.net import budget
from polygym.net.asgi_transport import Handoff, asgi_request
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.agent import Agent, AgentConfig
from polygym.servers.base import (
    BaseServer,
    JsonEndpoint,
    ServerConfig,
    direct_routes,
    json_endpoint,
    owned_copy,
)
from polygym.servers.episodic import EpisodicConfig, EpisodicServer
from polygym.servers.inbound import InboundGuard
from polygym.servers.model import ModelServer
from polygym.servers.resources import ResourcesServer, ResourcesServerConfig
from polygym.testing import in_process_client


class LimitConfig(ResourcesServerConfig):
    limit: int = 3


class Limited(ResourcesServer[LimitConfig]):
    pass


class LimitedChild(Limited):
    """No parameter: the parent's config class stays."""


def test_each_base_validates_with_the_bound_of_its_parameter() -> None:
    assert BaseServer.config_class is ServerConfig
    assert ResourcesServer.config_class is ResourcesServerConfig
    assert EpisodicServer.config_class is EpisodicConfig
    assert Agent.config_class is AgentConfig
    assert ModelServer.config_class is ServerConfig


def test_the_parameter_is_the_config_class_and_subclasses_inherit_it() -> None:
    assert Limited.config_class is LimitConfig
    assert LimitedChild.config_class is LimitConfig
    server = LimitedChild("env", {"limit": 5})
    assert isinstance(server.config, LimitConfig) and server.config.limit == 5
    with pytest.raises(ValidationError, match="limit"):
        Limited("env", {"limit": "many"})


def test_an_unparameterized_subclass_gets_the_base_config() -> None:
    class Plain(ResourcesServer):
        pass

    assert isinstance(Plain("env").config, ResourcesServerConfig)


def test_a_parameter_that_is_not_a_server_config_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a ServerConfig subclass"):

        class Wrong(ResourcesServer[int]):  # type: ignore[type-var]
            pass


class Chatty(BaseServer):
    """A server whose liveness payload shows its whole config, secrets included."""

    async def health(self) -> dict[str, Any]:
        return {**await super().health(), "config": self.config.model_dump()}


async def test_liveness_never_serves_a_secret() -> None:
    config = {"openai_api_key": "sk-live-abcdefghijklmnop", "base_url": "http://u:hunter2-pass@h:8000/v1"}
    server = Chatty("chatty", config)
    status, _, body = await asgi_request(server.app, "GET", "/")
    assert status == 200
    shown = orjson.loads(body)["config"]
    assert shown["openai_api_key"] == "****"
    assert shown["base_url"] == "http://u:****@h:8000/v1"
    assert b"sk-live" not in body and b"hunter2" not in body


async def test_a_request_body_over_the_limit_is_refused_before_the_handler_runs() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    guarded = InboundGuard(app, max_body_bytes=100)
    status, _, body = await asgi_request(guarded, "POST", "/x", b"x" * 101)
    assert status == 413 and b"request body over 100 bytes" in body
    status, _, _ = await asgi_request(guarded, "POST", "/x", b"x" * 100)
    assert status == 200 and seen == [b"x" * 100]


async def test_a_direct_route_skips_the_app_behind_the_same_guard() -> None:
    served: list[str] = []

    def answering(who: str) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            served.append(f"{who} {(await receive())['body'].decode()}")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        return app

    guard = InboundGuard(answering("router"), max_body_bytes=10, direct={("POST", "/x"): answering("x")})
    assert (await asgi_request(guard, "POST", "/x", b"1"))[0] == 200
    assert (await asgi_request(guard, "GET", "/x", b"2"))[0] == 200
    assert (await asgi_request(guard, "POST", "/y", b"3"))[0] == 200
    assert (await asgi_request(guard, "POST", "/x", b"x" * 11))[0] == 413  # bounded all the same
    assert served == ["x 1", "router 2", "router 3"]


def test_direct_routes_are_the_ones_the_router_would_pick() -> None:
    first, second, third, fourth = (JsonEndpoint(lambda body, request: body) for _ in range(4))

    class Asgi:  # an object, not a function: Starlette routes every method to it, as to the MCP bridge
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("not called")

    table = direct_routes(
        [
            Route("/a", first.handle_request, methods=["POST"]),
            Route("/a", second.handle_request, methods=["POST", "PUT"]),  # only PUT is still free
            Route("/p/{x}", third.handle_request, methods=["POST"]),  # path parameters: the router's
            Route("/m", Asgi()),  # an ASGI app takes every method at /m
            Route("/m", fourth.handle_request, methods=["POST"]),
            Mount("/sub", routes=[]),
            Route("/after", fourth.handle_request, methods=["POST"]),  # a mount may match first
        ]
    )
    assert table == {("POST", "/a"): first, ("PUT", "/a"): second}


class Budgeted(BaseServer):
    """Answers with what its handler saw of the request: its headers and the caller's budget."""

    def routes(self) -> list[Route]:
        return [*super().routes(), Route("/seen", json_endpoint(self._seen), methods=["POST"])]

    async def _seen(self, body: Any, request: Any) -> dict[str, Any]:
        left = budget.current()
        return {"body": body, "agent": request.headers.get("user-agent"), "attempts": left.attempts}


async def test_a_json_route_over_http_keeps_the_request_errors_and_routing_of_the_app() -> None:
    server = Budgeted("budgeted")
    app_server = AppServer(server.app, bind_socket("127.0.0.1", 0))
    await app_server.start()
    client = ServerClient()
    client.set_address("budgeted", app_server.url)
    try:
        headers = {"user-agent": "probe", budget.ATTEMPTS_HEADER: "2"}
        seen = await client.request_url("POST", app_server.url + "/seen", {"a": 1}, headers=headers)
        assert seen.json() == {"body": {"a": 1}, "agent": "probe", "attempts": 2}
        empty = await client.request_url("POST", app_server.url + "/seen")
        assert empty.status == 200 and empty.json()["body"] == {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(app_server.url + "/seen", data=b"{") as broken,
        ):
            assert broken.status == 400 and "not valid JSON" in await broken.text()
        assert (await client.request_url("GET", app_server.url + "/seen")).status == 405
        assert (await client.request_url("POST", app_server.url + "/nowhere", {})).status == 404
    finally:
        await client.close()
        await app_server.stop()


class Gate(BaseModel):
    pass


class Gated(ResourcesServer):
    """A tool that waits until the test opens the gate, so a request can be seen in flight."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.gate = asyncio.Event()

    @tool
    async def wait(self, body: Gate, session: Session) -> dict[str, bool]:
        """Wait for the gate."""
        await self.gate.wait()
        return {"ok": True}


async def test_in_flight_counts_requests_in_process_and_over_http_but_not_pings() -> None:
    server = Gated()
    client = in_process_client(server, "gated")
    app_server = AppServer(server.app, bind_socket("127.0.0.1", 0))
    await app_server.start()
    try:
        local = asyncio.ensure_future(client.call("gated", "/wait", {}))
        remote = asyncio.ensure_future(client.request_url("POST", app_server.url + "/wait", {}))
        deadline = asyncio.get_running_loop().time() + 10
        while server.in_flight.count < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        ping = (await client.request_url("GET", app_server.url + "/")).json()
        assert ping["in_flight"] == 2
        server.gate.set()
        assert (await local).json() == {"ok": True} and (await remote).status == 200
        assert (await client.request_url("GET", app_server.url + "/")).json()["in_flight"] == 0
    finally:
        await client.close()
        await app_server.stop()


class Kept(BaseModel):
    items: list[Any]


class Keeper(BaseServer):
    """Returns what it keeps: an in-process caller must get its own copy, as over the wire."""

    def __init__(self) -> None:
        super().__init__("keeper")
        self.kept: dict[str, Any] = {"items": [{"n": 1}]}

    def routes(self) -> list[Route]:
        return [
            *super().routes(),
            Route("/plain", json_endpoint(self._plain), methods=["POST"]),
            Route("/model", json_endpoint(self._model), methods=["POST"]),
        ]

    async def _plain(self, body: Any, request: Any) -> dict[str, Any]:
        return self.kept

    async def _model(self, body: Any, request: Any) -> Kept:
        return Kept(items=self.kept["items"])


@pytest.mark.parametrize("path", ["/plain", "/model"])
async def test_an_in_process_reply_shares_nothing_with_the_callee(path: str) -> None:
    server = Keeper()
    client = in_process_client(server, "keeper")
    assert isinstance(await server.dispatch("POST", path, b"{}", {}), Handoff)  # not encoded
    reply = await client.call("keeper", path, {})
    value = reply.json()
    assert value == {"items": [{"n": 1}]} and reply.body == b'{"items":[{"n":1}]}'
    value["items"][0]["n"] = 99
    value["items"].append("more")
    assert server.kept == {"items": [{"n": 1}]}
    assert reply.json() == {"items": [{"n": 1}]}  # parsed from the body, encoded before the change


def test_owned_copy_of_a_model_is_fresh_all_the_way_down() -> None:
    inner = {"x": [1, 2]}
    copied = owned_copy(Kept(items=[inner]))
    assert copied == {"items": [{"x": [1, 2]}]}
    assert copied["items"][0] is not inner and copied["items"][0]["x"] is not inner["x"]
