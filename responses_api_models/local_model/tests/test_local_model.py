"""local_model with the real embedded model, served on a loopback socket, driven by the openai SDK.

The model is loaded once for the module (a few seconds); every generation is kept short (a few
dozen tokens at most) so the whole module stays well under a minute on two CPU cores.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI, BadRequestError

from polygym import TRAINING_TOKEN_FIELDS
from polygym.testing import AppServer, bind_socket, load_config
from responses_api_models.local_model.app import LocalModel

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "local_model.yaml"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER_TOOL = {
    "type": "function",
    "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")},
}
SYSTEM = "You are a travel assistant. Call get_weather for the city the user asks about, then answer."
QUESTION = "What is the weather in Oslo right now?"


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    stack = load_config([CONFIG_FILE], env_files=[])
    spec = stack.servers["policy_model"]
    assert spec.implementation == "local_model"
    return spec.config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(shipped: dict[str, Any]) -> AsyncIterator[tuple[LocalModel, AppServer]]:
    model = LocalModel("policy_model", {**shipped, "n_ctx": 2048, "n_parallel": 2})
    srv = AppServer(model.app, bind_socket())
    await srv.start()  # runs the lifespan: assembles/finds the weights and loads the model
    yield model, srv
    await srv.stop()


@pytest.fixture
def client(served: tuple[LocalModel, AppServer]) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0)


def weather_input() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


async def test_shipped_config_and_startup(served: tuple[LocalModel, AppServer]) -> None:
    model, srv = served
    assert model.config.model == "qwen2.5-coder-0.5b"
    assert model.model_path is not None and model.model_path.name.endswith(".gguf")
    assert model.startup_seconds["total_s"] > 0
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/") as reply:
        health = await reply.json()
    assert health["loaded"] is True and health["model"] == "qwen2.5-coder-0.5b"
    assert health["n_parallel"] == 2


async def test_responses_tool_call_with_token_ids(
    served: tuple[LocalModel, AppServer], client: AsyncOpenAI
) -> None:
    model = served[0]
    response = await client.responses.create(
        model="local",
        input=weather_input(),
        tools=[WEATHER_TOOL],
        temperature=0,
        max_output_tokens=40,
        extra_body={"return_token_ids": True},
    )
    assert [item.type for item in response.output] == ["function_call"]
    call = response.output[0]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Oslo"}
    assert call.call_id

    fields = call.model_extra or {}
    prompt_ids, generation_ids, log_probs = (fields[name] for name in TRAINING_TOKEN_FIELDS)
    assert len(generation_ids) == len(log_probs) > 0
    assert all(isinstance(t, int) for t in prompt_ids + generation_ids)
    assert all(lp <= 0 for lp in log_probs)
    assert response.usage is not None
    assert response.usage.input_tokens == len(prompt_ids)
    assert response.usage.output_tokens == len(generation_ids)
    engine = model.engine
    assert engine is not None
    assert QUESTION in await engine.detokenize(prompt_ids)
    # The generated text (the call, however it was wrapped) decodes to the same call.
    generated = await engine.detokenize(generation_ids)
    text = generated.replace("<|im_end|>", "").replace("<tool_call>", "").replace("</tool_call>", "")
    text = text.strip().removeprefix("```json").removesuffix("```").strip()
    decoded = json.loads(text)
    assert decoded["name"] == "get_weather" and decoded["arguments"] == {"city": "Oslo"}


async def test_next_turn_extends_the_exact_ids_of_the_tool_call(
    served: tuple[LocalModel, AppServer], client: AsyncOpenAI
) -> None:
    """Token-in/token-out: turn 2's prompt is turn 1's prompt + generation, then the tool output."""
    engine = served[0].engine
    assert engine is not None and engine.eos_text == "<|im_end|>" and engine.n_vocab > 0
    params: dict[str, Any] = {"model": "local", "tools": [WEATHER_TOOL], "temperature": 0}
    params["extra_body"] = {"return_token_ids": True}
    first = await client.responses.create(input=weather_input(), max_output_tokens=40, **params)
    call = first.output[-1].model_dump()
    assert call["type"] == "function_call" and "prompt_continuation" not in call
    history = [
        *weather_input(),
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]
    second = await client.responses.create(input=history, max_output_tokens=8, **params)
    fields = second.output[-1].model_extra or {}
    assert fields["prompt_continuation"] == {"exact": True}
    parent = call["prompt_token_ids"] + call["generation_token_ids"]
    prompt = fields["prompt_token_ids"]
    assert prompt[: len(parent)] == parent
    added = await engine.detokenize(prompt[len(parent) :])
    assert added.startswith("\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>")
    assert added.endswith("<|im_start|>assistant\n")


async def test_answer_token_ids_detokenize_to_the_text(
    served: tuple[LocalModel, AppServer], client: AsyncOpenAI
) -> None:
    model = served[0]
    response = await client.responses.create(
        model="local",
        input="Say hello in five words.",
        temperature=0,
        max_output_tokens=12,
        include=["message.output_text.logprobs"],
        extra_body={"return_token_ids": True},
    )
    message = response.output[-1]
    assert message.type == "message"
    text = response.output_text
    assert text
    fields = message.model_extra or {}
    generation_ids = fields["generation_token_ids"]
    assert len(generation_ids) == len(fields["generation_log_probs"])
    assert model.engine is not None
    decoded = await model.engine.detokenize(generation_ids)
    assert decoded.removesuffix("<|im_end|>") == text
    part = message.content[0]
    assert part.type == "output_text"
    assert "".join(lp.token for lp in part.logprobs or []).removesuffix("<|im_end|>") == text


async def test_chat_completions_with_tools(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="local",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        tools=[CHAT_WEATHER_TOOL],
        temperature=0,
        max_tokens=40,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    extra = choice.message.model_extra or {}
    assert len(extra["generation_token_ids"]) == len(extra["generation_log_probs"]) > 0
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [e.logprob for e in choice.logprobs.content] == extra["generation_log_probs"]
    assert completion.usage is not None and completion.usage.prompt_tokens == len(extra["prompt_token_ids"])


async def test_same_seed_same_text_at_temperature_one(client: AsyncOpenAI) -> None:
    """The seed drives sampling: same seed, same text; another seed, (almost surely) another text.

    Compared under the same conditions (the prompt already cached, nothing else running): llama.cpp
    on CPU computes a token's logits with slightly different rounding when the prompt was processed
    in other chunks or other sequences share the batch, which can change a sample (README.md).
    """

    async def sample(seed: int) -> tuple[str, list[int]]:
        response = await client.responses.create(
            model="local",
            input="Write one sentence about the sea.",
            temperature=1.0,
            top_p=1.0,
            max_output_tokens=16,
            extra_body={"seed": seed, "return_token_ids": True},
        )
        return response.output_text, (response.output[-1].model_extra or {})["generation_token_ids"]

    await sample(1)  # put the prompt in the cache
    first = await sample(1234)
    assert first[0]
    assert await sample(1234) == first
    others = {(await sample(seed))[0] for seed in (7, 99)}
    assert others != {first[0]}


async def test_repeated_call_becomes_an_answer(client: AsyncOpenAI) -> None:
    """After the tool result the 0.5B model calls get_weather(Oslo) again; it must answer instead."""
    history = [
        *weather_input(),
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"city": "Oslo", "weather_description": "Oslo: snow, -3 degrees Celsius"}',
        },
    ]
    response = await client.responses.create(
        model="local", input=history, tools=[WEATHER_TOOL], temperature=0, max_output_tokens=40
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text.strip()
    assert not response.output_text.lstrip().startswith(("{", "[", "<", "`"))


async def test_tool_choice_none_and_required(client: AsyncOpenAI) -> None:
    none = await client.responses.create(
        model="local",
        input=weather_input(),
        tools=[WEATHER_TOOL],
        tool_choice="none",
        temperature=0,
        max_output_tokens=16,
    )
    assert [item.type for item in none.output] == ["message"]
    required = await client.responses.create(
        model="local",
        input="Hi there!",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=40,
    )
    assert [item.type for item in required.output] == ["function_call"]
    assert "city" in json.loads(required.output[0].arguments)


async def test_exotic_tool_schema_and_structured_output(client: AsyncOpenAI) -> None:
    """A schema llama.cpp cannot compile (dangling $ref, unknown format) must not break the call."""
    odd = {
        "type": "function",
        "name": "schedule",
        "description": "Schedule a meeting.",
        "parameters": {
            "type": "object",
            "properties": {"when": {"type": "string", "format": "no-such-format"}, "who": {"$ref": "#/x"}},
            "required": ["when"],
        },
    }
    called = await client.responses.create(
        model="local",
        input="Schedule a meeting tomorrow at noon.",
        tools=[odd],
        tool_choice={"type": "function", "name": "schedule"},
        temperature=0,
        max_output_tokens=40,
    )
    assert [item.type for item in called.output] == ["function_call"]
    assert isinstance(json.loads(called.output[0].arguments)["when"], str)

    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    structured = await client.responses.create(
        model="local",
        input="Invent a person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": person}},
        temperature=0,
        max_output_tokens=40,
    )
    answer = json.loads(structured.output_text)
    assert set(answer) == {"name", "age"} and isinstance(answer["age"], int)


async def test_requests_share_slots_without_blocking_the_event_loop(
    served: tuple[LocalModel, AppServer], client: AsyncOpenAI
) -> None:
    url = served[1].url
    generations = [
        asyncio.create_task(
            client.responses.create(
                model="local", input=f"Count to {n}.", temperature=0, max_output_tokens=24
            )
        )
        for n in (5, 6, 7)
    ]
    # Liveness answers while generations run: the llama.cpp calls happen off the event loop.
    seen_busy = False
    async with aiohttp.ClientSession() as http:
        while not seen_busy and not all(task.done() for task in generations):
            async with http.get(url + "/") as reply:
                seen_busy = (await reply.json())["in_flight"] >= 1
    assert seen_busy
    responses = await asyncio.gather(*generations)
    assert all(r.output_text for r in responses)


async def test_clear_errors(client: AsyncOpenAI) -> None:
    with pytest.raises(
        BadRequestError, match=r"the prompt has \d+ tokens; local_model's context \(n_ctx\) is 2048"
    ):
        await client.responses.create(model="local", input="word " * 3000, max_output_tokens=4)
    with pytest.raises(BadRequestError, match="tool_choice names 'nope'"):
        await client.responses.create(
            model="local",
            input="hi",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "nope"},
        )
    with pytest.raises(BadRequestError, match="temperature must be between 0 and 2"):
        await client.responses.create(model="local", input="hi", temperature=5)
    with pytest.raises(BadRequestError, match="stream=true is not supported"):
        await client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "hi"}], stream=True
        )
