"""A model server probes its upstream: ``gym env start``'s ``ready:`` line and ``gym env status``
say when the policy cannot be reached, naming the URL without its secrets; ``gym env status``
never cuts a server's name."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from polygym.cli.env import server_table
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.model import UPSTREAM_PROBE
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.scripted_model.app import ScriptedModel
from tests.conftest import run_gym, wait_until

SECRET = "sk-never-shown-1234567890"


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL nothing listens on: a port bound, then closed (never a guessed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"


def openai_model(base_url: str) -> OpenAIModel:
    return OpenAIModel(
        "policy_model", {"openai_base_url": base_url, "openai_api_key": SECRET, "openai_model": "m"}
    )


async def test_a_dead_upstream_is_reported_by_the_model_servers_health(dead_url: str) -> None:
    server = openai_model(dead_url.replace("http://", "http://user:pw@"))
    health = await server.health()
    [probe] = health[UPSTREAM_PROBE]
    assert probe["ok"] is False and probe["reachable"] is False
    assert probe["url"] == dead_url.replace("http://", "http://user:****@") + "/models"
    assert SECRET not in json.dumps(health) and ":pw@" not in json.dumps(health)
    await server.client.close()
    await server.shutdown()


async def test_a_live_scripted_upstream_is_ok() -> None:
    upstream = AppServer(ScriptedModel("scripted", {}).app, bind_socket())
    await upstream.start()
    server = openai_model(upstream.url + "/v1")
    try:
        [probe] = (await server.health())[UPSTREAM_PROBE]
        assert probe == {"url": upstream.url + "/v1/models", "reachable": True, "ok": True, "status": 200}
    finally:
        await server.client.close()
        await server.shutdown()
        await upstream.stop()


async def test_a_model_with_nothing_upstream_probes_nothing() -> None:
    server = ScriptedModel("scripted", {})
    assert UPSTREAM_PROBE not in await server.health()


def ready_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("ready:"))


def status_of(name: str) -> str:
    result = run_gym("env", "status", "--json")
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)
    return str(record["health"][name])


@pytest.mark.e2e
def test_start_and_status_say_the_policy_cannot_be_reached(start_stack: Any, dead_url: str) -> None:
    stack = start_stack(
        "--model-type",
        "openai_model",
        "--resources-server",
        "example_single_tool_call",
        f"policy_base_url={dead_url}",
        f"policy_api_key={SECRET}",
        "policy_model_name=m",
        "--head-port",
        "0",
    )
    assert wait_until(lambda: "ready:" in stack.output(), 30)
    line = ready_line(stack.output())
    assert f"but policy_model upstream {dead_url}/models unreachable (ConnectionRefused)" in line
    status = status_of("policy_model")
    assert status == f"upstream {dead_url}/models unreachable (ConnectionRefused)"
    assert not status.startswith("ok")
    assert SECRET not in stack.output()


@pytest.mark.e2e
def test_a_stack_without_an_upstream_is_ready_and_ok(start_stack: Any) -> None:
    stack = start_stack(
        "--model-type", "scripted_model", "--resources-server", "example_single_tool_call", "--head-port", "0"
    )
    assert wait_until(lambda: "ready:" in stack.output(), 30)
    assert "but" not in ready_line(stack.output())
    assert status_of("policy_model") == "ok"


def test_status_never_cuts_a_long_server_name() -> None:
    """180 columns, a 65-character name: it folds onto a second line, never ends in an ellipsis."""
    name = "a_resources_server_with_a_rather_long_name_for_its_environment_v2"
    entry = {"name": name, "kind": "resources_servers", "implementation": name, "url": "http://127.0.0.1:4"}
    buffer = io.StringIO()
    Console(file=buffer, width=180).print(server_table([entry], "t", {name: "ok"}, {name: 0}))
    rows = [line for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert "…" not in buffer.getvalue()
    assert "".join(row.split("│")[1].strip() for row in rows) == name
