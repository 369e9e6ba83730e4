"""anthropic_model against a fake Messages upstream on loopback (``tests/net/fake_upstream``).

What it sends (Anthropic headers, the converted body, the forced model), what it makes of the
reply, and how it fails: upstream errors unchanged, retries on 429/529, unreachable, timeout,
oversized and non-JSON replies, and no key in anything it shows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym import NO_RETRY
from polygym.models import failure
from polygym.testing import AppServer, Reply, ServerClient, bind_socket, load_config, server_class
from responses_api_models.anthropic_model.app import AnthropicModel
from tests.net.fake_upstream import Answer, FakeUpstream, gzip_bomb, hang, reply

CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "anthropic_model.yaml"
KEY = "sk-ant-secret-0123456789abcdef"
FAST_RETRY = {"max_attempts": 3, "retry_base_delay_s": 0.001, "retry_max_delay_s": 0.01}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOL_USE_REPLY = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-upstream",
    "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "output_tokens": 7,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 0,
    },
}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def message_reply(body: dict[str, Any] = TOOL_USE_REPLY, status: int = 200) -> Answer:
    return reply(status, orjson.dumps(body))


@pytest.fixture
async def raw() -> AsyncIterator[ServerClient]:
    client = ServerClient()
    yield client
    await client.close()


async def serve(base_url: str, **extra: Any) -> AppServer:
    config = {
        "anthropic_base_url": base_url,
        "anthropic_api_key": KEY,
        "anthropic_model": "claude-t",
        **extra,
    }
    server = AppServer(AnthropicModel("policy_model", config).app, bind_socket())
    await server.start()
    return server


async def post(raw: ServerClient, server: AppServer, path: str, body: dict[str, Any]) -> Reply:
    return await raw.request_url("POST", server.url + path, body, retry=NO_RETRY)


async def test_sends_anthropic_headers_and_converted_body(raw: ServerClient) -> None:
    async with FakeUpstream([message_reply()]) as upstream:
        proxy = await serve(upstream.url)
        try:
            body = {
                "model": "caller-model",
                "instructions": "Be terse.",
                "input": [{"role": "user", "content": "weather in Oslo?"}],
                "tools": [WEATHER_TOOL],
                "temperature": 0.3,
            }
            answer = await post(raw, proxy, "/v1/responses", body)
        finally:
            await proxy.stop()
    (sent,) = upstream.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    request = json.loads(sent.body)
    assert request == {
        "model": "claude-t",  # forced: the policy is chosen by config
        "max_tokens": 4096,
        "system": "Be terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "weather in Oslo?"}]}],
        "tools": [
            {"name": "get_weather", "description": "Weather.", "input_schema": WEATHER_TOOL["parameters"]}
        ],
        "temperature": 0.3,
    }
    assert answer.status == 200
    response = answer.json()
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    call = response["output"][1]
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == (
        "toolu_01",
        "get_weather",
        {"city": "Oslo"},
    )
    assert response["usage"] == {
        "input_tokens": 15,
        "output_tokens": 7,
        "total_tokens": 22,
        "input_tokens_details": {"cached_tokens": 3, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},  # a full OpenAI Response, as NeMo Gym's agents need
    }
    assert (response["model"], response["status"], response["temperature"]) == ("claude-t", "completed", 0.3)


async def test_chat_completions_and_v1_base_url(raw: ServerClient) -> None:
    async with FakeUpstream([message_reply()]) as upstream:
        proxy = await serve(upstream.url + "/v1/")
        try:
            answer = await post(
                raw,
                proxy,
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9},
            )
        finally:
            await proxy.stop()
    assert upstream.requests[0].path == "/v1/messages"
    assert json.loads(upstream.requests[0].body)["max_tokens"] == 9
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."


@pytest.mark.parametrize(
    ("status", "body", "error_class"),
    [
        (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long"}},
            "Upstream4xx",
        ),
        (
            401,
            {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
            "Upstream4xx",
        ),
        (500, {"type": "error", "error": {"type": "api_error", "message": "boom"}}, "Upstream5xx"),
    ],
)
async def test_upstream_errors_pass_through_unchanged(
    raw: ServerClient, status: int, body: dict[str, Any], error_class: str
) -> None:
    async with FakeUpstream([message_reply(body, status)]) as upstream:
        proxy = await serve(upstream.url, **FAST_RETRY)
        try:
            answer = await post(raw, proxy, "/v1/responses", {"input": "x"})
            via_messages = await post(
                raw, proxy, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
            )
        finally:
            await proxy.stop()
    assert (answer.status, answer.json()) == (status, body)
    assert answer.headers[failure.FAILURE_HEADER] == error_class
    assert (via_messages.status, via_messages.json()) == (status, body)  # already Anthropic-shaped
    assert len(upstream.requests) == 2  # not transient: no retry


async def test_overloaded_and_rate_limited_are_retried(raw: ServerClient) -> None:
    answers = [message_reply(OVERLOADED, 529), message_reply(OVERLOADED, 429), message_reply()]
    async with FakeUpstream(answers) as upstream:
        proxy = await serve(upstream.url, **FAST_RETRY)
        try:
            answer = await post(raw, proxy, "/v1/responses", {"input": "x"})
        finally:
            await proxy.stop()
    assert answer.status == 200
    assert len(upstream.requests) == 3


async def test_overloaded_to_the_end_is_relayed(raw: ServerClient) -> None:
    async with FakeUpstream([message_reply(OVERLOADED, 529)]) as upstream:
        proxy = await serve(upstream.url, **FAST_RETRY)
        try:
            answer = await post(raw, proxy, "/v1/responses", {"input": "x"})
        finally:
            await proxy.stop()
    assert (answer.status, answer.json()) == (529, OVERLOADED)
    assert answer.headers[failure.FAILURE_HEADER] == failure.UPSTREAM_5XX
    assert len(upstream.requests) == 3  # bounded by max_attempts


async def test_upstream_down_is_a_clear_502_without_the_key(raw: ServerClient) -> None:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    base = f"http://user:hunter2@127.0.0.1:{port}"
    proxy = await serve(base, **FAST_RETRY)
    try:
        answer = await post(raw, proxy, "/v1/responses", {"input": "x"})
        health = await raw.request_url("GET", proxy.url + "/", retry=NO_RETRY)
    finally:
        await proxy.stop()
    assert answer.status == 502
    error = answer.json()["error"]
    assert error["type"] == "upstream_unreachable"
    assert f"127.0.0.1:{port}/v1/messages" in error["message"]
    assert "3 attempt(s)" in error["message"]
    for shown in (answer.body, health.body):
        assert b"hunter2" not in shown and KEY.encode() not in shown
    assert health.json()["model"] == "claude-t"


@pytest.mark.parametrize(
    ("answer", "extra", "status", "error_class"),
    [
        (hang(), {"timeout_s": 0.3}, 504, failure.TIMEOUT),
        (gzip_bomb(4 << 20), {"max_response_bytes": 1 << 20}, 502, failure.RESPONSE_TOO_LARGE),
        (reply(200, b"not json"), {}, 502, failure.BAD_JSON),
        (reply(200, b"[1, 2]"), {}, 502, failure.BAD_JSON),
    ],
)
async def test_failures_have_their_class(
    raw: ServerClient, answer: Answer, extra: dict[str, Any], status: int, error_class: str
) -> None:
    async with FakeUpstream([answer]) as upstream:
        proxy = await serve(upstream.url, **extra)
        try:
            result = await post(raw, proxy, "/v1/responses", {"input": "x"})
        finally:
            await proxy.stop()
    assert result.status == status
    assert result.headers[failure.FAILURE_HEADER] == error_class
    assert len(upstream.requests) == 1


async def test_stream_is_refused_on_responses(raw: ServerClient) -> None:
    async with FakeUpstream([message_reply()]) as upstream:
        proxy = await serve(upstream.url)
        try:
            answer = await post(raw, proxy, "/v1/responses", {"input": "x", "stream": True})
        finally:
            await proxy.stop()
    assert answer.status == 400 and "stream" in answer.json()["error"]["message"]
    assert upstream.requests == []


def test_config_requires_the_model() -> None:
    with pytest.raises(ValueError) as caught:
        AnthropicModel("policy_model", {"anthropic_api_key": "k"})
    assert "anthropic_model" in str(caught.value)


def test_shipped_config_builds_the_server() -> None:
    stack = load_config(
        [CONFIG_FILE],
        overrides=[
            "policy_base_url=https://api.anthropic.com",
            f"policy_api_key={KEY}",
            "policy_model_name=claude-t",
        ],
        env_files=[],
    )
    spec = stack.servers["policy_model"]
    assert spec.implementation == "anthropic_model"
    assert server_class(spec) is AnthropicModel
    server = AnthropicModel("policy_model", spec.config)
    assert (server.url, server.model_name) == ("https://api.anthropic.com/v1/messages", "claude-t")
    assert server.headers == {
        "accept": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": KEY,
    }
    assert server.config.max_tokens == 4096
