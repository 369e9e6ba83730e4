"""``POST /v1/messages`` end to end, driven by the official ``anthropic`` SDK on loopback.

A scripted model server answers Anthropic clients through the base route (create, stream, a
tool-use round trip, errors); then the whole chain: SDK -> our /v1/messages on anthropic_model ->
an upstream that speaks Messages (a scripted model's own /v1/messages) -> back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest

from polygym.net.asgi_transport import asgi_request
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES
from polygym.net.listen import AppServer, bind_socket
from responses_api_models.anthropic_model.app import AnthropicModel
from responses_api_models.openai_model.app import OpenAIModel
from responses_api_models.scripted_model.app import ScriptedModel
from tests.conftest import WEATHER_RULE

if TYPE_CHECKING:
    import anthropic

pytestmark = pytest.mark.e2e

T = TypeVar("T")

WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def start(app: Any) -> AppServer:
    server = AppServer(app, bind_socket())
    await server.start()
    return server


@pytest.fixture
async def scripted() -> AsyncIterator[AppServer]:
    server = await start(ScriptedModel("policy_model", {"rules": [WEATHER_RULE]}).app)
    yield server
    await server.stop()


async def with_sdk(url: str, use: Callable[[anthropic.Anthropic], T]) -> T:
    """Run ``use`` with a sync SDK client in a thread (the server shares this event loop)."""

    import anthropic  # here, not at the top: 2 s of import that every xdist worker would pay to collect

    def run() -> T:
        with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0) as client:
            return use(client)

    return await asyncio.to_thread(run)


def sdk_error(name: str) -> type[Exception]:
    """One of the SDK's error classes (the SDK is imported only by the tests that run it)."""
    import anthropic

    error: type[Exception] = getattr(anthropic, name)
    return error


def tool_round_trip(client: anthropic.Anthropic) -> list[Any]:
    """Ask, run the tool the model asked for, answer; returns both replies."""
    messages: list[Any] = [{"role": "user", "content": "What's the weather in Buenos Aires?"}]
    first = client.messages.create(
        model="any", max_tokens=64, system="You are terse.", messages=messages, tools=[WEATHER_TOOL]
    )
    (call,) = [block for block in first.content if block.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "warm"}]},
    ]
    second = client.messages.create(model="any", max_tokens=64, messages=messages, tools=[WEATHER_TOOL])
    return [first, second]


def check_round_trip(first: Any, second: Any, model: str) -> None:
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Buenos Aires"})
    assert second.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in second.content] == [("text", "It is warm in Buenos Aires.")]
    assert first.model == second.model == model
    assert first.id.startswith("msg_") and first.role == "assistant"
    # the scripted model counts words: system prompt + question in, "name arguments-JSON" out
    assert (first.usage.input_tokens, first.usage.output_tokens) == (3 + 6, 3)
    assert second.usage.output_tokens == 6


async def test_sdk_create_tool_round_trip(scripted: AppServer) -> None:
    first, second = await with_sdk(scripted.url, tool_round_trip)
    check_round_trip(first, second, "scripted")


async def test_sdk_stream_text_and_tool_use(scripted: AppServer) -> None:
    def stream(client: anthropic.Anthropic) -> tuple[list[str], Any, list[str], Any]:
        messages: Any = [{"role": "user", "content": "Say hello to Ada."}]
        with client.messages.stream(model="any", max_tokens=64, messages=messages) as events:
            texts = list(events.text_stream)
            text_reply = events.get_final_message()
        messages = [{"role": "user", "content": "weather in Lima?"}]
        with client.messages.stream(
            model="any", max_tokens=64, messages=messages, tools=[WEATHER_TOOL]
        ) as events:
            kinds: list[str] = [event.type for event in events]
            tool_reply = events.get_final_message()
        return texts, text_reply, kinds, tool_reply

    texts, text_reply, kinds, tool_reply = await with_sdk(scripted.url, stream)
    assert "".join(texts) == "Scripted model reply to: Say hello to Ada."
    assert (text_reply.stop_reason, text_reply.usage.output_tokens) == ("end_turn", 8)
    assert text_reply.content[0].text == "".join(texts)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "input_json", "content_block_stop", "message_delta"} <= set(kinds)
    assert tool_reply.stop_reason == "tool_use"
    assert (tool_reply.content[0].name, tool_reply.content[0].input) == ("get_weather", {"city": "Lima"})


async def test_raw_stream_is_anthropic_sse(scripted: AppServer) -> None:
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as client:
        reply = await client.post(scripted.url + "/v1/messages", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    names = [line.removeprefix("event: ") for line in reply.text.splitlines() if line.startswith("event: ")]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_bad_requests_get_anthropic_errors(scripted: AppServer) -> None:
    def bad(client: anthropic.Anthropic) -> list[Any]:
        caught = []
        bodies: list[Any] = [[], [{"role": "user", "content": [{"type": "video"}]}]]
        for messages in bodies:
            with pytest.raises(sdk_error("BadRequestError")) as error:
                client.messages.create(model="m", max_tokens=8, messages=messages)
            caught.append(error.value)
        return caught

    empty, unknown = await with_sdk(scripted.url, bad)
    assert empty.status_code == 400
    assert empty.body["type"] == "error"
    assert empty.body["error"]["type"] == "invalid_request_error"
    assert "messages" in empty.body["error"]["message"]
    assert "messages.0.content.0.type" in unknown.body["error"]["message"]
    async with httpx.AsyncClient() as client:
        reply = await client.post(scripted.url + "/v1/messages", content=b"{not json")
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


async def test_model_errors_come_back_anthropic_shaped(scripted: AppServer) -> None:
    """An error the model server raises keeps its status, in Anthropic's shape."""
    script = '[{"error": 429, "message": "slow down"}]'

    def limited(client: anthropic.Anthropic) -> Any:
        with pytest.raises(sdk_error("RateLimitError")) as error:
            client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": "x"}],
                extra_body={"metadata": {"script": script}},  # the scripted model's per-request script
            )
        return error.value

    error = await with_sdk(scripted.url, limited)
    assert error.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "scripted_error: slow down"},
    }


async def test_whole_chain_through_anthropic_model(scripted: AppServer) -> None:
    """SDK -> /v1/messages on anthropic_model -> an upstream speaking Messages -> back, tools included."""
    config = {
        "anthropic_base_url": scripted.url,
        "anthropic_api_key": "sk-ant-test",
        "anthropic_model": "claude-t",
    }
    proxy = await start(AnthropicModel("policy_model", config).app)
    try:
        first, second = await with_sdk(proxy.url, tool_round_trip)
        check_round_trip(first, second, "claude-t")  # the configured model, as the proxy reports it

        def stream(client: anthropic.Anthropic) -> Any:
            messages: Any = [{"role": "user", "content": "weather in Quito?"}]
            with client.messages.stream(
                model="m", max_tokens=64, messages=messages, tools=[WEATHER_TOOL]
            ) as events:
                return events.get_final_message()

        streamed = await with_sdk(proxy.url, stream)
        assert (streamed.stop_reason, streamed.content[0].input) == ("tool_use", {"city": "Quito"})
    finally:
        await proxy.stop()


async def test_messages_body_is_bounded() -> None:
    """The route sits behind the inbound guard like every other: an oversized body never reaches it."""
    server = ScriptedModel("policy_model", {})
    declared = [(b"content-length", str(DEFAULT_MAX_BODY_BYTES + 1).encode())]
    status, _, body = await asgi_request(server.app, "POST", "/v1/messages", b"{}", declared)
    assert status == 413 and b"request body over" in body


async def test_messages_on_a_server_that_relays_bytes(scripted: AppServer) -> None:
    """openai_model's ``responses`` returns the upstream's bytes: success and errors still convert."""
    config = {"openai_base_url": scripted.url + "/v1", "openai_model": "policy-7b", "max_attempts": 1}
    proxy = await start(OpenAIModel("policy_model", config).app)
    script = '[{"error": 500, "message": "policy crashed"}]'

    def use(client: anthropic.Anthropic) -> tuple[list[Any], Any]:
        replies = tool_round_trip(client)
        with pytest.raises(sdk_error("InternalServerError")) as error:
            client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": "x"}],
                extra_body={"metadata": {"script": script}},
            )
        return replies, error.value

    try:
        (first, second), error = await with_sdk(proxy.url, use)
    finally:
        await proxy.stop()
    check_round_trip(first, second, "scripted")
    assert error.body["type"] == "error"
    assert error.body["error"] == {"type": "api_error", "message": "scripted_error: policy crashed"}
    assert error.response.headers["x-polygym-failure"] == "Upstream5xx"
