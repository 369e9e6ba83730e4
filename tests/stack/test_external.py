"""``external`` servers: run by someone else, registered by URL, reached by name."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.errors import ConfigError
from polygym.net.client import ServerClient
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.external import external_entries
from polygym.stack.launcher import Stack
from tests.conftest import gym_command
from tests.e2e.test_stack_e2e import ENVS, example_rows

pytestmark = pytest.mark.e2e

MODEL = "policy_model"


def entries(config: dict[str, Any]) -> list[dict[str, Any]]:
    return external_entries(MODEL, "responses_api_models", config, "fleet.yaml")


def test_one_url_is_one_server_and_a_list_is_its_replicas() -> None:
    [one] = entries({"url": "http://vllm.models.svc:8000/"})
    assert one["url"] == "http://vllm.models.svc:8000" and "replica" not in one
    assert one["implementation"] == "external" and one["health_path"] == "/"
    many = entries({"url": ["http://a:8000", "https://b:8443"], "health_path": "/health"})
    assert [(e["url"], e["replica"], e["health_path"]) for e in many] == [
        ("http://a:8000", 0, "/health"),
        ("https://b:8443", 1, "/health"),
    ]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"url": "http://user:secret@a:8000"}, "must not carry credentials"),
        ({"url": "http://a:8000/v1"}, "must be the server's root"),
        ({"url": "http://a:8000/?x=1"}, "must be the server's root"),
        ({"url": "ftp://a"}, "must be http:// or https:// with a host"),
        ({"url": "http://:8000"}, "must be http:// or https:// with a host"),
        ({"url": "http://a:99999"}, "is not a valid URL"),
        ({}, "url must be a non-empty string"),
        ({"url": []}, "url must name at least one URL"),
        ({"url": ["http://a:1", "http://a:1/"]}, "listed twice"),
        ({"url": "http://a:1", "replicas": 2}, "replicas does not apply to an external server"),
        ({"url": "http://a:1", "api_key": "k"}, "unknown key 'api_key'"),
        ({"url": "http://a:1", "health_path": "health"}, "health_path must be a path starting with '/'"),
    ],
)
def test_unsafe_or_ambiguous_entries_are_refused_naming_the_server(
    config: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        entries(config)
    message = str(caught.value)
    assert expected in message and "policy_model.responses_api_models.external (from fleet.yaml)" in message
    assert "secret" not in message


def external_model_file(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"{MODEL}:\n  responses_api_models:\n    external:\n      url: {url}\n")
    return path


async def test_an_external_model_joins_the_registry_and_serves_rollouts(tmp_path: Path) -> None:
    fleet = Stack(
        load_config(selector_paths([], ["scripted_model"], []), env_files=[]), head_port=0, record=False
    )
    await fleet.start()
    try:
        [model] = fleet.servers()
        path = external_model_file(tmp_path, model["url"])
        config = load_config(selector_paths(list(ENVS), [], [str(path)]), env_files=[])
        stack = Stack(config, head_port=0, record=False)
        await stack.start()
        client = ServerClient(stack.head_url)
        try:
            registered = {e["name"]: e for e in await client.servers()}
            assert registered[MODEL]["url"] == model["url"].rstrip("/")
            assert registered[MODEL]["implementation"] == "external"
            assert registered[MODEL]["registered_by"] == "launcher"
            for env in ENVS:
                reply = await client.call(f"{env}_simple_agent", "/run", example_rows(env)[0])
                assert reply.json()["reward"] == 1.0
        finally:
            await client.close()
            await stack.stop()
    finally:
        await fleet.stop()


def test_status_pings_an_external_server_and_shows_it_down(start_stack: Any, tmp_path: Path) -> None:
    path = external_model_file(tmp_path, "http://127.0.0.1:1")
    start_stack("--resources-server", ENVS[0], "--config", str(path))
    status = subprocess.run(
        gym_command("env", "status", "--json"), capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    [record] = orjson.loads(status.stdout)
    assert record["health"][MODEL].startswith("down")
    assert record["health"][ENVS[0]].startswith("ok") and record["unexpected"] == []


def test_a_refused_external_entry_exits_2_before_anything_starts(tmp_path: Path) -> None:
    path = external_model_file(tmp_path, "http://user:pw@127.0.0.1:1")
    run = subprocess.run(
        gym_command("env", "start", "--resources-server", ENVS[0], "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "must not carry credentials" in run.stderr and "pw" not in run.stderr
