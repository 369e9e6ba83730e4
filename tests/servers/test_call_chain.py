"""One rollout's failure, end to end on loopback sockets: collector -> agent -> model server -> upstream.

Each server is a real polygym server on its own socket (as the subprocess backend places them),
and the upstream is ``FakeUpstream``, which misbehaves on purpose. What is checked is what a user
sees: how many requests reached the upstream (one retry budget for the whole chain, not one per
hop), the class in the failure record that goes to ``_failures.jsonl`` (the real failure, not
``HTTP 500``), and that the rollout's session was released.

The second half is a caller that goes away: the collector gives up on a rollout and the agent must
stop calling the model and release the session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from polygym import new_response
from polygym.collect.rollouts import Limits, collect
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.net.retry import NO_RETRY
from polygym.protocol import VerifyRequest, VerifyResponse
from polygym.row import make_job
from polygym.servers.base import BaseServer
from polygym.servers.model import ModelServer
from polygym.servers.resources import ResourcesServer, tool
from polygym.servers.sessions import Session
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.openai_model.app import OpenAIModel
from tests.net.fake_upstream import Answer, FakeUpstream, cut_reply, gzip_bomb, hang, reply

MiB = 1 << 20
MODEL_ATTEMPTS = 4
NOOP_TOOL = {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}}
ROW = {"responses_create_params": {"input": "go", "tools": [NOOP_TOOL]}}
RELEASE_DEADLINE_S = 10.0


class NoopRequest(BaseModel):
    pass


class Env(ResourcesServer):
    @tool
    async def noop(self, body: NoopRequest) -> dict[str, Any]:
        """Does nothing; the looping model calls it every turn."""
        return {"ok": True}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse(**body.model_dump(), reward=1.0)


class LoopingModel(ModelServer):
    """A policy that calls ``noop`` forever, counting its turns."""

    calls = 0

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        call = {"type": "function_call", "call_id": f"c{self.calls}", "name": "noop", "arguments": "{}"}
        return new_response([call], "looper", None)


@dataclass
class Chain:
    env: Env
    agent: SimpleAgent
    agent_url: str
    servers: list[AppServer]
    clients: list[ServerClient]

    def collector(self, in_process: bool = False) -> ServerClient:
        """The collector's client; ``in_process``: as the inline backend calls the agent."""
        client = ServerClient()
        client.set_address("agent", self.agent_url)
        if in_process:
            client.add_local("agent", self.agent.app, self.agent.dispatch)
        self.clients.append(client)
        return client


async def start_chain(model: BaseServer, agent_config: dict[str, Any] | None = None) -> Chain:
    """Env, model and agent, each on its own socket; the agent reaches the others over HTTP."""
    stack_client = ServerClient()
    env = Env("env", {}, stack_client)
    agent = SimpleAgent(
        "agent",
        {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            **(agent_config or {}),
        },
        stack_client,
    )
    servers = []
    for name, server in (("env", env), ("policy_model", model), ("agent", agent)):
        app_server = AppServer(server.app, bind_socket())
        await app_server.start()
        servers.append(app_server)
        stack_client.set_address(name, app_server.url)
    return Chain(env, agent, servers[-1].url, servers, [stack_client])


async def stop_chain(chain: Chain) -> None:
    for client in chain.clients:
        await client.close()
    for server in reversed(chain.servers):
        await server.stop()


@pytest.fixture
async def chains() -> AsyncIterator[list[Chain]]:
    started: list[Chain] = []
    yield started
    for chain in started:
        await stop_chain(chain)


def proxy(upstream_url: str, **extra: Any) -> OpenAIModel:
    config = {
        "openai_base_url": upstream_url + "/v1",
        "openai_model": "m",
        "max_attempts": MODEL_ATTEMPTS,
        "retry_base_delay_s": 0.001,
        "retry_max_delay_s": 0.005,
        "timeout_s": 5,
        **extra,
    }
    return OpenAIModel("policy_model", config)


@pytest.mark.parametrize(
    ("answer", "model_extra", "error_class", "upstream_requests"),
    [
        (reply(429, b'{"error": {"message": "slow down"}}', {"Retry-After": "0"}), {}, "RateLimited", 4),
        (reply(503, b'{"error": {"message": "overloaded"}}'), {}, "Upstream5xx", 4),
        (cut_reply(), {}, "ConnectionReset", 4),
        (gzip_bomb(8 * MiB), {"max_response_bytes": MiB}, "ResponseTooLarge", 1),
        (reply(200, b"<html>not json</html>"), {}, "BadJSON", 1),
        (hang(), {"timeout_s": 0.3}, "Timeout", 1),
    ],
    ids=["429", "503", "reset-mid-body", "gzip-bomb", "bad-json", "timeout"],
)
async def test_an_upstream_failure_is_retried_once_per_chain_and_recorded_as_itself(
    chains: list[Chain], answer: Answer, model_extra: dict[str, Any], error_class: str, upstream_requests: int
) -> None:
    """The collector, the agent and the model server each retry up to 4 times; the upstream sees at
    most the model server's 4 attempts (it was 64 when every hop retried), and the failure record
    names the upstream's failure."""
    async with FakeUpstream([answer]) as upstream:
        chain = await start_chain(proxy(upstream.url, **model_extra))
        chains.append(chain)
        results = [
            r async for r in collect([make_job(ROW, "agent", 0, 0)], chain.collector(), Limits(timeout_s=30))
        ]
    (result,) = results
    assert result.failure is not None
    assert result.failure["error_class"] == error_class, result.failure["error"]
    assert len(upstream.requests) == upstream_requests
    assert chain.env.sessions.stats()["active"] == 0


@pytest.mark.parametrize("in_process", [False, True], ids=["socket", "in-process"])
async def test_a_rollout_whose_caller_gives_up_stops_and_releases_its_session(
    chains: list[Chain], in_process: bool
) -> None:
    """The collector gives up after 0.3 s (over a socket: it disconnects; in process: it cancels);
    the agent must then make no further model call and release the session, although the
    collector's deadline has passed (it would otherwise loop for 100 000 steps, session held)."""
    model = LoopingModel("policy_model")
    chain = await start_chain(model, {"max_steps": 100_000})
    chains.append(chain)
    collector = chain.collector(in_process)
    with pytest.raises(ServerCallError) as caught:
        await collector.call("agent", "/run", ROW, timeout_s=0.3, retry=NO_RETRY)
    assert caught.value.error_class == "Timeout"
    assert model.calls > 0
    stop = time.monotonic() + RELEASE_DEADLINE_S
    while chain.env.sessions.stats()["released"] == 0:
        assert time.monotonic() < stop, f"session still held {RELEASE_DEADLINE_S:g}s after the caller left"
        await asyncio.sleep(0.01)
    assert chain.env.sessions.stats()["active"] == 0
    calls_at_release = model.calls
    for _ in range(20):  # the loop, if still alive, would call the model on every turn
        await asyncio.sleep(0.01)
    assert model.calls == calls_at_release
