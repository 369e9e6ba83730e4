"""The server bases: the config class comes from the generic parameter, stated once per subclass."""

import pytest
from pydantic import ValidationError

from polygym.servers.agent import Agent, AgentConfig
from polygym.servers.base import BaseServer, ServerConfig
from polygym.servers.episodic import EpisodicConfig, EpisodicServer
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
