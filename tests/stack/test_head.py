"""The head registry admits only its own stack's servers and never silently replaces a name."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from polygym.cli.env import _unexpected
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.net.retry import NO_RETRY
from polygym.stack.head import (
    BY_LAUNCHER,
    BY_SECRET,
    MAX_REGISTRATION_BYTES,
    STACK_SECRET_HEADER,
    Registry,
    head_app,
    nemo_config,
    relay_name,
)

SECRET = "s3cret-for-this-test-only"


def entry(name: str = "policy_model", url: str = "http://127.0.0.1:9", pid: int = 42) -> dict:
    return {"name": name, "kind": "responses_api_models", "implementation": "x", "url": url, "pid": pid}


@pytest.fixture
async def head() -> AsyncIterator[tuple[Registry, str, ServerClient]]:
    registry = Registry()
    server = AppServer(head_app(registry, {}, "stack-x", SECRET), bind_socket())
    await server.start()
    client = ServerClient(pool_size=4)
    try:
        yield registry, server.url, client
    finally:
        await client.close()
        await server.stop()


async def post_register(client: ServerClient, url: str, body: object, secret: str | None) -> tuple[int, str]:
    headers = {} if secret is None else {STACK_SECRET_HEADER: secret}
    reply = await client.request_url("POST", f"{url}/register", body, headers=headers, retry=NO_RETRY)
    return reply.status, reply.json()["error"]["message"] if reply.status != 200 else ""


@pytest.mark.parametrize(("secret", "status"), [(None, 401), ("wrong", 403), (SECRET + "x", 403), ("", 403)])
async def test_registration_without_the_stack_secret_is_refused(
    head: tuple[Registry, str, ServerClient], secret: str | None, status: int
) -> None:
    registry, url, client = head
    code, message = await post_register(client, url, entry(), secret)
    assert code == status
    assert "secret" in message and SECRET not in message
    assert registry.entries == {}


async def test_a_stranger_body_is_not_even_parsed(head: tuple[Registry, str, ServerClient]) -> None:
    _, url, client = head
    reply = await client.request_url(
        "POST", f"{url}/register", headers={"content-type": "application/json"}, retry=NO_RETRY
    )
    assert reply.status == 401


async def test_an_oversized_registration_is_refused_unread(head: tuple[Registry, str, ServerClient]) -> None:
    registry, url, client = head
    big = {**entry(), "padding": "x" * (MAX_REGISTRATION_BYTES + 1)}
    code, _ = await post_register(client, url, big, SECRET)
    assert code == 413 and registry.entries == {}
    assert (await post_register(client, url, entry(), SECRET))[0] == 200


async def test_registration_with_the_secret_is_recorded_as_such(
    head: tuple[Registry, str, ServerClient],
) -> None:
    registry, url, client = head
    assert await post_register(client, url, entry(), SECRET) == (200, "")
    listed = (await client.request_url("GET", f"{url}/servers", retry=NO_RETRY)).json()
    assert [(e["name"], e["url"], e["pid"], e["registered_by"]) for e in listed] == [
        ("policy_model", "http://127.0.0.1:9", 42, BY_SECRET)
    ]
    assert SECRET not in str(listed) and registry.entries["policy_model"]["registered_by"] == BY_SECRET


async def test_a_held_name_is_not_replaced_even_with_the_secret(
    head: tuple[Registry, str, ServerClient],
) -> None:
    registry, url, client = head
    registry.register(entry())
    code, message = await post_register(client, url, entry(url="http://127.0.0.1:6666", pid=7), SECRET)
    assert code == 409
    assert "'policy_model' is already registered (url http://127.0.0.1:9, pid 42)" in message
    assert registry.entries["policy_model"]["url"] == "http://127.0.0.1:9"
    assert registry.entries["policy_model"]["registered_by"] == BY_LAUNCHER


async def test_the_same_server_repeating_its_registration_is_accepted(
    head: tuple[Registry, str, ServerClient],
) -> None:
    """A retry whose first reply was lost must not make a server fail to start."""
    registry, url, client = head
    assert await post_register(client, url, entry(), SECRET) == (200, "")
    first = registry.entries["policy_model"]["registered_at"]
    assert await post_register(client, url, entry(), SECRET) == (200, "")
    assert registry.entries["policy_model"]["registered_at"] == first


async def test_only_the_launcher_replaces_a_server() -> None:
    registry = Registry()
    registry.register(entry())
    registry.remove("policy_model")
    registry.register(entry(url="http://127.0.0.1:7777", pid=8))
    assert registry.entries["policy_model"]["url"] == "http://127.0.0.1:7777"


async def test_a_head_without_a_secret_admits_no_http_registration() -> None:
    registry = Registry()
    server = AppServer(head_app(registry, {}, "stack-y"), bind_socket())
    await server.start()
    client = ServerClient(pool_size=4)
    try:
        assert (await post_register(client, server.url, entry(), ""))[0] == 403
        assert (await post_register(client, server.url, entry(), None))[0] == 401
    finally:
        await client.close()
        await server.stop()
    assert registry.entries == {}


def test_status_names_entries_the_launcher_did_not_start() -> None:
    launched = [entry("policy_model"), entry("agent", "http://127.0.0.1:10", 43)]
    held = [entry("policy_model", "http://127.0.0.1:6666"), entry("agent", "http://127.0.0.1:10", 43)]
    assert _unexpected(held, launched) == ["policy_model"]
    assert _unexpected([*launched, entry("extra", "http://127.0.0.1:11", 44)], launched) == ["extra"]
    assert _unexpected(launched, launched) == []


@pytest.mark.parametrize(
    ("agent", "implementation", "taken", "relay"),
    [
        ("example_multi_step_simple_agent", "simple_agent", set(), "example_multi_step_environment_server"),
        ("math_agent", "custom", set(), "math_environment_server"),
        ("solver", "custom", set(), "solver_environment_server"),
        ("simple_agent", "simple_agent", set(), "simple_agent_environment_server"),
        ("x_simple_agent", "simple_agent", {"x_environment_server"}, "x_simple_agent_environment_server"),
    ],
)
def test_relays_take_the_name_nemo_gym_would_give_them(
    agent: str, implementation: str, taken: set[str], relay: str
) -> None:
    assert relay_name(agent, implementation, taken) == relay


def test_nemo_gyms_config_fronts_every_agent_with_a_relay_at_its_own_address() -> None:
    """NeMo Gym 0.7's collector reaches an agent only through an environment server naming it."""
    agents = {
        "a_simple_agent": {
            **entry("a_simple_agent", "http://127.0.0.1:7001"),
            "kind": "responses_api_agents",
        },
        "b_simple_agent": {
            **entry("b_simple_agent", "http://127.0.0.1:7002"),
            "kind": "responses_api_agents",
        },
    }
    for agent in agents.values():
        agent["implementation"] = "simple_agent"
    entries = {"policy_model": entry(), **agents}
    config = nemo_config({}, entries, "http://127.0.0.1:11000", {"b_front": "b_simple_agent"})
    assert config["a_environment_server"] == {
        "environment_servers": {
            "legacy_agent": {
                "agent_server": {"type": "responses_api_agents", "name": "a_simple_agent"},
                "host": "127.0.0.1",
                "port": 7001,
            }
        }
    }
    assert config["b_front"]["environment_servers"]["legacy_agent"]["port"] == 7002
    assert "b_environment_server" not in config and "policy_model_environment_server" not in config


def test_an_agent_an_environment_server_fronts_gets_no_relay() -> None:
    """NeMo Gym generates a relay only for an agent no environment server names (any
    ``{type: responses_api_agents}`` field, or an untyped ``agent_server``), so its collector never
    finds two servers for one agent."""
    agents = {
        name: {**entry(name, f"http://127.0.0.1:{port}"), "kind": "responses_api_agents"}
        for name, port in (("a_simple_agent", 7001), ("b_simple_agent", 7002), ("c_simple_agent", 7003))
    }
    for agent in agents.values():
        agent["implementation"] = "simple_agent"
    episodes = {
        "turns": {"environment_servers": {"single_agent_turn": {"agent_server": {"name": "a_simple_agent"}}}},
        "users": {
            "environment_servers": {
                "nemo_user_sim": {"user": {"type": "responses_api_agents", "name": "b_simple_agent"}}
            }
        },
    }
    config = nemo_config(episodes, agents, "http://127.0.0.1:11000")
    relays = {
        name for name, block in config.items() if "legacy_agent" in block.get("environment_servers", {})
    }
    assert relays == {"c_environment_server"}
