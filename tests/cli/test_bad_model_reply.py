"""A model upstream that answers 200 with no Response (an empty body, a JSON list) fails the rollout
as ``BadJSON`` naming what came, never as the agent's ``HTTP 500 AttributeError``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym.cli import gym
from polygym.jsonl import iter_jsonl
from polygym.net.client import Reply, ServerCallError
from polygym.net.listen import AppServer, bind_socket
from tests.conftest import ROOT

EXAMPLE = ROOT / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"


def answering(body: bytes) -> Starlette:
    async def endpoint(request: Request) -> Response:
        return Response(body, status_code=200, media_type="application/json")

    return Starlette(routes=[Route("/v1/responses", endpoint, methods=["POST"])])


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fake upstream on loopback, from a thread of its own (the command runs its own loop)."""
    loop = asyncio.new_event_loop()
    server = AppServer(answering(request.param), bind_socket())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    yield server.url + "/v1"
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("upstream", "what"),
    [(b"", "reply is an empty body"), (b"[]", "reply is JSON list, not an object")],
    indirect=["upstream"],
)
def test_a_200_without_a_response_object_is_bad_json(tmp_path: Path, upstream: str, what: str) -> None:
    out = tmp_path / "out.jsonl"
    args = ["eval", "run", "--model-type", "openai_model", "--resources-server", "example_single_tool_call"]
    args += ["--input", str(EXAMPLE), "--limit", "1", "--output", str(out)]
    args += [f"policy_base_url={upstream}", "policy_api_key=k", "policy_model_name=m"]
    result = CliRunner().invoke(gym, args, catch_exceptions=False)
    assert result.exit_code == 1
    [failure] = iter_jsonl(tmp_path / "out_failures.jsonl")
    assert failure["error_class"] == "BadJSON", failure["error"]
    assert what in failure["error"] and "AttributeError" not in failure["error"]


@pytest.mark.parametrize(("body", "kind"), [(b"", "an empty body"), (b"3", "JSON int"), (b'"x"', "JSON str")])
def test_json_object_names_what_came_instead(body: bytes, kind: str) -> None:
    with pytest.raises(ServerCallError) as info:
        Reply(200, body).json_object()
    assert info.value.error_class == "BadJSON" and kind in str(info.value)
    assert Reply(200, b'{"a": 1}').json_object() == {"a": 1}
