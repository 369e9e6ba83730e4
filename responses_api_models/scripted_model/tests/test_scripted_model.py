"""scripted_model: the shipped rules solve the example environments; scripts, fallback, chat API.

Servers run on real loopback sockets and are driven with the official ``openai`` SDK, so the
objects we return are the ones real clients parse.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from polygym import NO_RETRY
from polygym.testing import AppServer, ServerClient, bind_socket, load_config
from responses_api_models.scripted_model.app import Config, ScriptedModel

CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "scripted_model.yaml"

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SYNONYM_TOOLS = [
    {
        "type": "function",
        "name": "get_synonym_value",
        "parameters": {
            "type": "object",
            "properties": {"synonym": {"type": "string"}},
            "required": ["synonym"],
        },
    },
    {
        "type": "function",
        "name": "extract_synonym_values",
        "parameters": {
            "type": "object",
            "properties": {"synonym_values": {"type": "array", "items": {"type": "integer"}}},
            "required": ["synonym_values"],
        },
    },
]


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool},
    }


def shipped_config() -> dict[str, Any]:
    """The shipped config file, read through polygym's own loader."""
    stack = load_config([CONFIG_FILE], env_files=[])
    spec = stack.servers["policy_model"]
    assert spec.implementation == "scripted_model"
    return spec.config


async def serve(server: ScriptedModel) -> AppServer:
    srv = AppServer(server.app, bind_socket())
    await srv.start()
    return srv


@pytest.fixture
async def shipped() -> AsyncIterator[AppServer]:
    srv = await serve(ScriptedModel("policy_model", shipped_config()))
    yield srv
    await srv.stop()


@pytest.fixture
async def sdk(shipped: AppServer) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=shipped.url + "/v1", api_key="x", max_retries=0)
    yield client
    await client.close()


def replay(input_: list[dict[str, Any]], response: Any, outputs: list[str]) -> list[dict[str, Any]]:
    """The next request's input: the model's function calls and the tool outputs fed back."""
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == len(outputs)
    extra: list[dict[str, Any]] = []
    for call, output in zip(calls, outputs, strict=True):
        extra.append(call.model_dump(exclude_none=True))
        extra.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    return [*input_, *extra]


# ------------------------------------------------------------------------------- shipped rules


@pytest.mark.parametrize(
    ("prompt", "city"),
    [
        ("What's the weather in New York?", "New York"),
        ("Tell me the weather in Paris. Be brief", "Paris"),
        ("how is the weather in San Luis Obispo, today", "San Luis Obispo"),
        ("Check weather in Berlin!", "Berlin"),
    ],
)
async def test_weather_rule_turn_by_turn(sdk: AsyncOpenAI, prompt: str, city: str) -> None:
    input_: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    first = await sdk.responses.create(model="scripted", input=input_, tools=[WEATHER_TOOL])
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": city}
    assert call.call_id

    tool_output = json.dumps({"city": city, "weather_description": "cold and rainy"})
    second = await sdk.responses.create(
        model="scripted", input=replay(input_, first, [tool_output]), tools=[WEATHER_TOOL]
    )
    assert [item.type for item in second.output] == ["message"]
    assert second.output_text == f"The weather in {city}: {tool_output}"
    assert second.usage is not None and second.usage.output_tokens == len(second.output_text.split())


async def test_synonym_rule_turn_by_turn(sdk: AsyncOpenAI) -> None:
    words = ["Happy", "Quick", "Bright"]
    values = {"Happy": 7, "Quick": 3, "Bright": 12}
    input_: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Get the values, then extract them. synonyms: {', '.join(words)}."},
    ]
    for word in words:
        response = await sdk.responses.create(model="scripted", input=input_, tools=SYNONYM_TOOLS)
        (call,) = response.output
        assert call.type == "function_call"
        assert (call.name, json.loads(call.arguments)) == ("get_synonym_value", {"synonym": word})
        input_ = replay(input_, response, [json.dumps({"synonym_value": values[word]})])

    response = await sdk.responses.create(model="scripted", input=input_, tools=SYNONYM_TOOLS)
    (call,) = response.output
    assert call.name == "extract_synonym_values"
    assert json.loads(call.arguments) == {"synonym_values": [7, 3, 12]}
    input_ = replay(input_, response, ['{"success": true}'])

    final = await sdk.responses.create(model="scripted", input=input_, tools=SYNONYM_TOOLS)
    assert final.output_text == 'The synonym values are {"success": true}'


async def test_rule_needs_its_tools(sdk: AsyncOpenAI) -> None:
    """A weather prompt without the weather tool falls through to the generic fallback."""
    other = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    response = await sdk.responses.create(model="scripted", input="weather in Oslo?", tools=[other])
    assert (response.output[0].name, json.loads(response.output[0].arguments)) == ("lookup", {})


async def test_chat_completions_weather(sdk: AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Rio de Janeiro?"}]
    first = await sdk.chat.completions.create(
        model="scripted", messages=messages, tools=[chat_tool(WEATHER_TOOL)]
    )
    choice = first.choices[0]
    assert first.object == "chat.completion"
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rio de Janeiro"}

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    second = await sdk.chat.completions.create(
        model="scripted", messages=messages, tools=[chat_tool(WEATHER_TOOL)]
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "The weather in Rio de Janeiro: sunny"
    assert second.usage is not None and second.usage.completion_tokens == 7
    assert second.usage.prompt_tokens == 13  # 8 prompt words + 4 in the call + 1 in its output
    assert second.usage.total_tokens == second.usage.prompt_tokens + second.usage.completion_tokens


async def test_chat_completions_synonyms(sdk: AsyncOpenAI) -> None:
    tools = [chat_tool(t) for t in SYNONYM_TOOLS]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "synonyms: big, small."}]
    seen = []
    for value in (5, 9):
        choice = (await sdk.chat.completions.create(model="m", messages=messages, tools=tools)).choices[0]
        (call,) = choice.message.tool_calls
        seen.append(json.loads(call.function.arguments)["synonym"])
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"synonym_value": value})}
        )
    choice = (await sdk.chat.completions.create(model="m", messages=messages, tools=tools)).choices[0]
    assert seen == ["big", "small"]
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"synonym_values": [5, 9]}


async def test_responses_are_deterministic_apart_from_ids(sdk: AsyncOpenAI) -> None:
    def stable(response: Any) -> dict[str, Any]:
        data = response.model_dump()
        for key in ("id", "created_at"):
            data.pop(key)
        for item in data["output"]:
            item.pop("id", None)
            item.pop("call_id", None)
        return data

    kwargs: dict[str, Any] = {"model": "scripted", "input": "weather in Lima?", "tools": [WEATHER_TOOL]}
    first, second = [await sdk.responses.create(**kwargs) for _ in range(2)]
    assert stable(first) == stable(second)
    assert first.model == "scripted"
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (3, 2)


# --------------------------------------------------------------------------------- fallback


async def test_generic_fallback_calls_each_tool_with_schema_arguments() -> None:
    tools = [
        {
            "type": "function",
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "mode": {"type": "string", "enum": ["fast", "slow"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "filter": {
                        "type": "object",
                        "properties": {"field": {"type": "string"}, "optional": {"type": "string"}},
                        "required": ["field"],
                    },
                    "day": {"type": "string", "format": "date"},
                    "page": {"$ref": "#/$defs/Page"},
                    "not_required": {"type": "string"},
                },
                "$defs": {"Page": {"type": "integer", "minimum": 2}},
                "required": ["query", "limit", "score", "exact", "mode", "tags", "filter", "day", "page"],
            },
        },
        {"type": "function", "name": "finish", "parameters": {"type": "object", "properties": {}}},
    ]
    srv = await serve(ScriptedModel("m", {}))
    sdk = AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    try:
        input_: list[dict[str, Any]] = [{"role": "user", "content": "anything at all"}]
        first = await sdk.responses.create(model="m", input=input_, tools=tools)
        assert first.output[0].name == "search"
        # Required properties only, valid for the schema (polygym.authoring.json_schema.example_arguments).
        assert json.loads(first.output[0].arguments) == {
            "query": "example",
            "limit": 1,
            "score": 1.0,
            "exact": True,
            "mode": "fast",
            "tags": ["example"],
            "filter": {"field": "example"},
            "day": "2024-01-01",
            "page": 2,
        }
        input_ = replay(input_, first, ["ok"])
        second = await sdk.responses.create(model="m", input=input_, tools=tools)
        assert (second.output[0].name, json.loads(second.output[0].arguments)) == ("finish", {})
        input_ = replay(input_, second, ["ok"])
        third = await sdk.responses.create(model="m", input=input_, tools=tools)
        assert third.output_text == "done"

        echo = await sdk.responses.create(model="m", input="Say   hello\nplease")
        assert echo.output_text == "Scripted model reply to: Say hello please"
        chat = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == "Scripted model reply to: hi"
        assert chat.choices[0].finish_reason == "stop"
    finally:
        await sdk.close()
        await srv.stop()


# ---------------------------------------------------------------------------------- scripts


async def test_metadata_script_with_error_turn() -> None:
    script = [
        {"tool": "lookup", "arguments": {"q": "x", "n": 2}},
        {"error": 503, "message": "simulated overload"},
    ]
    srv = await serve(ScriptedModel("m", {}))
    sdk = AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    raw = ServerClient()
    metadata = {"script": json.dumps(script)}
    try:
        first = await sdk.responses.create(model="m", input="go", metadata=metadata)
        assert (first.output[0].name, json.loads(first.output[0].arguments)) == ("lookup", {"q": "x", "n": 2})

        input_ = replay([{"role": "user", "content": "go"}], first, ["result"])
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk.responses.create(model="m", input=input_, metadata=metadata)
        assert caught.value.status_code == 503

        body = {"input": input_, "metadata": metadata}
        reply = await raw.request_url("POST", srv.url + "/v1/responses", body, retry=NO_RETRY)
        assert reply.status == 503
        assert reply.json() == {"error": {"type": "scripted_error", "message": "simulated overload"}}

        # the chat endpoint plays the same script
        messages = [{"role": "user", "content": "go"}]
        chat = await sdk.chat.completions.create(model="m", messages=messages, metadata=metadata)
        assert chat.choices[0].message.tool_calls[0].function.name == "lookup"
    finally:
        await raw.close()
        await sdk.close()
        await srv.stop()


async def test_script_runs_out_then_answers_done_and_overrides_rules(shipped: AppServer) -> None:
    sdk = AsyncOpenAI(base_url=shipped.url + "/v1", api_key="x", max_retries=0)
    try:
        script = json.dumps([{"answer": "forty-two", "sleep_ms": 30}])
        metadata = {"script": script}
        started = time.monotonic()
        first = await sdk.responses.create(
            model="m", input="weather in Rome?", tools=[WEATHER_TOOL], metadata=metadata
        )
        assert time.monotonic() - started >= 0.03
        assert first.output_text == "forty-two"

        input_ = [
            {"role": "user", "content": "weather in Rome?"},
            {"role": "assistant", "content": "forty-two"},
        ]
        second = await sdk.responses.create(model="m", input=input_, tools=[WEATHER_TOOL], metadata=metadata)
        assert second.output_text == "done"
    finally:
        await sdk.close()


async def test_config_script_and_bad_request_script() -> None:
    server = ScriptedModel("m", {"script": [{"tool": "a", "arguments": '{"k": 1}'}, {"answer": "fin"}]})
    srv = await serve(server)
    raw = ServerClient()
    try:
        url = srv.url + "/v1/responses"
        reply = await raw.request_url("POST", url, {"input": "x"}, retry=NO_RETRY)
        (item,) = reply.json()["output"]
        assert (item["name"], item["arguments"]) == ("a", '{"k": 1}')

        bad = {"input": "x", "metadata": {"script": '[{"tool": "a", "answer": "b"}]'}}
        reply = await raw.request_url("POST", url, bad, retry=NO_RETRY)
        assert reply.status == 400
        assert "exactly one of" in reply.json()["error"]["message"]

        reply = await raw.request_url(
            "POST", url, {"input": "x", "metadata": {"script": "[{"}}, retry=NO_RETRY
        )
        assert reply.status == 400
        assert "not valid JSON" in reply.json()["error"]["message"]
    finally:
        await raw.close()
        await srv.stop()


async def test_rule_error_names_the_missing_field(shipped: AppServer) -> None:
    raw = ServerClient()
    try:
        input_ = [
            {"role": "user", "content": "synonyms: a."},
            {"type": "function_call", "call_id": "c1", "name": "get_synonym_value", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": '{"other": 1}'},
        ]
        body = {"input": input_, "tools": SYNONYM_TOOLS}
        reply = await raw.request_url("POST", shipped.url + "/v1/responses", body, retry=NO_RETRY)
        assert reply.status == 500
        assert "no field 'synonym_value'" in reply.json()["error"]["message"]
    finally:
        await raw.close()


async def test_latency_ms_delays_every_answer() -> None:
    srv = await serve(ScriptedModel("m", {"latency_ms": 40}))
    raw = ServerClient()
    try:
        started = time.monotonic()
        reply = await raw.request_url("POST", srv.url + "/v1/responses", {"input": "x"}, retry=NO_RETRY)
        assert reply.status == 200
        assert time.monotonic() - started >= 0.04
    finally:
        await raw.close()
        await srv.stop()


# ------------------------------------------------------------------------------ config checks


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "(", "calls": []}, "not a valid regular expression"),
        ({"match": "in (?P<city>\\w+)", "calls": [{"tool": "t", "arguments": {"c": "{town}"}}]}, "{town}"),
        ({"calls": [{"tool": "t", "for_each": {"group": "words"}}]}, "for_each.group 'words'"),
        (
            {"calls": [{"tool": "t", "arguments": {"v": {"$outputs": "other", "field": "x"}}}]},
            "no earlier call",
        ),
        ({"answer": "{nope}"}, "{nope}"),
        ({"calls": [{"tool": "t", "argumets": {}}]}, "argumets"),
    ],
)
def test_rule_mistakes_are_reported_at_load(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Config.model_validate({"rules": [{"name": "r", **rule}]})
    assert message in str(caught.value)


def test_script_error_status_must_be_an_error() -> None:
    with pytest.raises(ValueError, match="400-599"):
        Config.model_validate({"script": [{"error": 200}]})


# ------------------------------------------------------------------- the example environments' data

ROOT = Path(__file__).resolve().parents[3]


def example_rows(environment: str) -> list[dict[str, Any]]:
    path = ROOT / "resources_servers" / environment / "data" / "example.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def play(server: ScriptedModel, params: dict[str, Any], tool_output: Any) -> list[dict[str, Any]]:
    """Run one episode in-process; ``tool_output(name, arguments)`` stands in for the environment."""
    input_ = list(params["input"])
    for _ in range(20):
        (item,) = (await server.respond({**params, "input": input_}))["output"]
        input_.append(item)
        if item["type"] != "function_call":
            return input_
        output = tool_output(item["name"], json.loads(item["arguments"]))
        input_.append({"type": "function_call_output", "call_id": item["call_id"], "output": output})
    raise AssertionError("the episode did not end")


async def test_shipped_rules_solve_example_single_tool_call_rows() -> None:
    server = ScriptedModel("policy_model", shipped_config())
    for row in example_rows("example_single_tool_call"):
        episode = await play(
            server, row["responses_create_params"], lambda name, args: f"sunny in {args['city']}"
        )
        calls = [i for i in episode if i.get("type") == "function_call"]
        assert [json.loads(c["arguments"]) for c in calls] == [{"city": row["expected_city"]}]
        assert episode[-1]["type"] == "message"
        assert f"sunny in {row['expected_city']}" in episode[-1]["content"][0]["text"]


async def test_shipped_rules_solve_example_multi_step_rows() -> None:
    server = ScriptedModel("policy_model", shipped_config())
    for row in example_rows("example_multi_step"):
        words = row["expected_synonyms"]

        def tool_output(name: str, args: dict[str, Any], words: list[str] = words) -> str:
            if name == "get_synonym_value":
                return json.dumps({"synonym_value": words.index(args["synonym"]) * 10})
            return json.dumps({"success": True})

        episode = await play(server, row["responses_create_params"], tool_output)
        calls = [(i["name"], json.loads(i["arguments"])) for i in episode if i.get("type") == "function_call"]
        assert calls == [
            *[("get_synonym_value", {"synonym": w}) for w in words],
            ("extract_synonym_values", {"synonym_values": [i * 10 for i in range(len(words))]}),
        ]
        assert episode[-1]["type"] == "message"


# ------------------------------------------------------------------------- fake training tokens


async def test_fake_token_ids_on_request_and_config() -> None:
    from responses_api_models.scripted_model.app import fake_token_ids

    raw = ServerClient()
    srv = await serve(ScriptedModel("m", {}))
    configured = await serve(ScriptedModel("m", {"return_token_ids": True}))
    try:
        input_ = [{"role": "user", "content": "hi there"}]
        body = {"input": input_, "instructions": "be nice", "return_token_ids": True}
        reply = (await raw.request_url("POST", srv.url + "/v1/responses", body, retry=NO_RETRY)).json()
        item = reply["output"][-1]
        prompt = b"<|system|>be nice\n<|user|>hi there\n"
        assert bytes(item["prompt_token_ids"]) == prompt
        assert bytes(item["generation_token_ids"]) == b"<|assistant|>Scripted model reply to: hi there\n"
        assert item["generation_log_probs"] == [0.0] * len(item["generation_token_ids"])
        # off unless asked; the config turns it on and a request can turn it off again
        plain = await raw.request_url("POST", srv.url + "/v1/responses", {"input": input_}, retry=NO_RETRY)
        assert "prompt_token_ids" not in plain.json()["output"][-1]
        url = configured.url + "/v1/responses"
        on = await raw.request_url("POST", url, {"input": input_}, retry=NO_RETRY)
        assert "generation_token_ids" in on.json()["output"][-1]
        off = {"input": input_, "return_token_ids": False}
        reply = await raw.request_url("POST", configured.url + "/v1/responses", off, retry=NO_RETRY)
        assert "generation_token_ids" not in reply.json()["output"][-1]
        # the next turn's prompt extends this turn's prompt + generation (history fed back as is)
        again = {"input": [*input_, item, {"role": "user", "content": "more"}], "return_token_ids": True}
        reply = (await raw.request_url("POST", srv.url + "/v1/responses", again, retry=NO_RETRY)).json()
        next_prompt = reply["output"][-1]["prompt_token_ids"]
        assert next_prompt[: len(prompt) - len(b"<|system|>be nice\n")] == list(b"<|user|>hi there\n")
        history = [*input_, item]
        assert next_prompt == fake_token_ids([*history, {"role": "user", "content": "more"}])
        assert fake_token_ids(history) == list(b"<|user|>hi there\n") + item["generation_token_ids"]
    finally:
        await raw.close()
        await srv.stop()
        await configured.stop()
