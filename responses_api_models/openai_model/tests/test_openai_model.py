"""openai_model: forwards to an OpenAI-compatible upstream, unchanged errors, retries, timeouts.

Two kinds of upstream, both on real loopback sockets: the scripted model (a real policy, to show
the official SDK works through the proxy) and a tiny recording Starlette app (to see exactly what
the proxy sent and to make the upstream fail on purpose).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym import NO_RETRY
from polygym.testing import AppServer, ServerClient, bind_socket
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.scripted_model.app import ScriptedModel
from tests.conftest import WEATHER_RULE, sdk_weather_round_trip

FAST_RETRY = {"max_attempts": 3, "retry_base_delay_s": 0.001, "retry_max_delay_s": 0.01}


@dataclass
class Recorder:
    """A fake upstream: records each request and answers with the next queued reply."""

    replies: list[tuple[int, bytes, str]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hang: bool = False

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            self.requests.append(
                {
                    "path": request.url.path,
                    "headers": dict(request.headers),
                    "body": json.loads(await request.body()),
                }
            )
            if self.hang:
                await self.release.wait()
            status, body, media_type = (
                self.replies.pop(0) if self.replies else (200, b'{"ok": true}', "application/json")
            )
            return Response(body, status_code=status, media_type=media_type)

        return Starlette(
            routes=[Route(p, endpoint, methods=["POST"]) for p in ("/v1/responses", "/v1/chat/completions")]
        )


async def start(app: Any) -> AppServer:
    srv = AppServer(app, bind_socket())
    await srv.start()
    return srv


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, AppServer]]:
    rec = Recorder()
    srv = await start(rec.app())
    yield rec, srv
    rec.release.set()
    await srv.stop()


@pytest.fixture
async def raw() -> AsyncIterator[ServerClient]:
    client = ServerClient()
    yield client
    await client.close()


def proxy_config(base_url: str, **extra: Any) -> dict[str, Any]:
    return {"openai_base_url": base_url, "openai_api_key": "sk-test", "openai_model": "policy-7b", **extra}


async def test_sdk_through_proxy_to_scripted_model() -> None:
    upstream = await start(ScriptedModel("scripted", {"rules": [WEATHER_RULE]}).app)
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1/")).app)
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="ignored", max_retries=0)
    try:
        await sdk_weather_round_trip(sdk)

        models = await sdk.models.list()
        assert [m.id for m in models.data] == ["policy-7b"]
    finally:
        await sdk.close()
        await proxy.stop()
        await upstream.stop()


async def test_scripted_error_comes_back_unchanged_through_the_proxy(raw: ServerClient) -> None:
    upstream = await start(ScriptedModel("scripted", {}).app)
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1")).app)
    try:
        body = {
            "input": "x",
            "metadata": {"script": json.dumps([{"error": 500, "message": "policy crashed"}])},
        }
        direct = await raw.request_url("POST", upstream.url + "/v1/responses", body, retry=NO_RETRY)
        proxied = await raw.request_url("POST", proxy.url + "/v1/responses", body, retry=NO_RETRY)
        assert (proxied.status, proxied.body) == (direct.status, direct.body) == (500, direct.body)
        assert b"policy crashed" in proxied.body
    finally:
        await proxy.stop()
        await upstream.stop()


async def test_forces_model_and_sends_bearer_key(recorder: tuple[Recorder, AppServer]) -> None:
    rec, upstream = recorder
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1")).app)
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="caller-key", max_retries=0)
    try:
        await sdk.responses.create(model="gpt-caller", input="hi", temperature=0.5)
        await sdk.chat.completions.create(model="gpt-caller", messages=[{"role": "user", "content": "hi"}])
        assert [r["path"] for r in rec.requests] == ["/v1/responses", "/v1/chat/completions"]
        for request in rec.requests:
            assert request["headers"]["authorization"] == "Bearer sk-test"
            assert request["body"]["model"] == "policy-7b"
        assert rec.requests[0]["body"]["temperature"] == 0.5
        assert rec.requests[0]["body"]["input"] == "hi"
        assert rec.requests[1]["body"]["messages"] == [{"role": "user", "content": "hi"}]
    finally:
        await sdk.close()
        await proxy.stop()


@pytest.mark.parametrize(
    ("status", "body", "media_type"),
    [
        (
            400,
            b'{"error": {"message": "context length exceeded", "code": "context_length_exceeded"}}',
            "application/json",
        ),
        (401, b'{"error": {"message": "bad key"}}', "application/json"),
        (500, b"Internal Server Error (plain text)", "text/plain"),
    ],
)
async def test_upstream_errors_pass_through_unchanged(
    recorder: tuple[Recorder, AppServer], raw: ServerClient, status: int, body: bytes, media_type: str
) -> None:
    rec, upstream = recorder
    rec.replies.append((status, body, media_type))
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1", **FAST_RETRY)).app)
    try:
        reply = await raw.request_url("POST", proxy.url + "/v1/responses", {"input": "x"}, retry=NO_RETRY)
        assert (reply.status, reply.body) == (status, body)
        assert len(rec.requests) == 1  # not transient: answered at once, no retry
    finally:
        await proxy.stop()


async def test_sdk_sees_upstream_status(recorder: tuple[Recorder, AppServer]) -> None:
    rec, upstream = recorder
    rec.replies.append((404, b'{"error": {"message": "model policy-7b not found"}}', "application/json"))
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1")).app)
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.responses.create(model="m", input="x")
        assert "model policy-7b not found" in str(caught.value)
    finally:
        await sdk.close()
        await proxy.stop()


async def test_transient_statuses_are_retried_then_relayed(
    recorder: tuple[Recorder, AppServer], raw: ServerClient
) -> None:
    rec, upstream = recorder
    rec.replies += [(429, b'{"error": "slow down"}', "application/json"), (503, b"busy", "text/plain")]
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1", **FAST_RETRY)).app)
    try:
        reply = await raw.request_url(
            "POST", proxy.url + "/v1/chat/completions", {"messages": []}, retry=NO_RETRY
        )
        assert (reply.status, reply.json()) == (200, {"ok": True})
        assert len(rec.requests) == 3

        rec.requests.clear()
        rec.replies += [(503, b"busy", "text/plain")] * 3
        reply = await raw.request_url(
            "POST", proxy.url + "/v1/chat/completions", {"messages": []}, retry=NO_RETRY
        )
        assert (reply.status, reply.body) == (503, b"busy")  # the last upstream answer, unchanged
        assert len(rec.requests) == 3  # bounded by max_attempts
    finally:
        await proxy.stop()


async def test_upstream_down_gives_a_clear_502(raw: ServerClient) -> None:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    base = f"http://127.0.0.1:{port}/v1"
    proxy = await start(OpenAIModel("policy_model", proxy_config(base, **FAST_RETRY)).app)
    try:
        reply = await raw.request_url("POST", proxy.url + "/v1/responses", {"input": "x"}, retry=NO_RETRY)
        assert reply.status == 502
        error = reply.json()["error"]
        assert error["type"] == "upstream_unreachable"
        assert f"{base}/responses" in error["message"]
        assert "3 attempt(s)" in error["message"]
    finally:
        await proxy.stop()


async def test_upstream_timeout_gives_a_504(recorder: tuple[Recorder, AppServer], raw: ServerClient) -> None:
    rec, upstream = recorder
    rec.hang = True
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1", timeout_s=0.2)).app)
    try:
        started = time.monotonic()
        reply = await raw.request_url("POST", proxy.url + "/v1/responses", {"input": "x"}, retry=NO_RETRY)
        assert time.monotonic() - started < 5
        assert reply.status == 504
        error = reply.json()["error"]
        assert error["type"] == "upstream_timeout"
        assert f"{upstream.url}/v1/responses" in error["message"]
        assert "0.2s" in error["message"]
    finally:
        rec.release.set()
        await proxy.stop()


async def test_stream_is_refused_clearly(recorder: tuple[Recorder, AppServer], raw: ServerClient) -> None:
    rec, upstream = recorder
    proxy = await start(OpenAIModel("policy_model", proxy_config(upstream.url + "/v1")).app)
    try:
        body = {"input": "x", "stream": True}
        reply = await raw.request_url("POST", proxy.url + "/v1/responses", body, retry=NO_RETRY)
        assert reply.status == 400
        assert "stream" in reply.json()["error"]["message"]
        assert rec.requests == []
    finally:
        await proxy.stop()


def test_config_requires_upstream_fields() -> None:
    with pytest.raises(ValueError) as caught:
        OpenAIModel("policy_model", {"openai_api_key": "k"})
    assert "openai_base_url" in str(caught.value)
    assert "openai_model" in str(caught.value)
    server = OpenAIModel("policy_model", {"openai_base_url": "http://h/v1", "openai_model": "m"})
    assert (server.config.timeout_s, server.config.pool_size) == (600.0, None)


@pytest.mark.parametrize(
    ("stack_pool", "configured", "upstream_pool"), [(3000, None, 3000), (0, None, 0), (3000, 16, 16)]
)
def test_upstream_pool_follows_the_stack_unless_set(
    stack_pool: int, configured: int | None, upstream_pool: int
) -> None:
    """No hidden cap: unset, the upstream pool is the stack's (its concurrency; 0 = no limit)."""
    config = {"openai_base_url": "http://h/v1", "openai_model": "m", "pool_size": configured}
    server = OpenAIModel("policy_model", config, ServerClient(pool_size=stack_pool))
    assert server.upstream.pool_size == upstream_pool
    assert (
        OpenAIModel(
            "policy_model", {"openai_base_url": "http://h/v1", "openai_model": "m"}
        ).upstream.pool_size
        == 0
    )
