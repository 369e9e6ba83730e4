"""The server bases: the config class comes from the generic parameter, stated once per subclass."""

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from polygym.net.asgi_transport import asgi_request
from polygym.servers.agent import Agent, AgentConfig
from polygym.servers.base import BaseServer, ServerConfig
from polygym.servers.episodic import EpisodicConfig, EpisodicServer
from polygym.servers.inbound import InboundGuard
from polygym.servers.model import ModelServer
from polygym.servers.resources import ResourcesServer, ResourcesServerConfig


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
