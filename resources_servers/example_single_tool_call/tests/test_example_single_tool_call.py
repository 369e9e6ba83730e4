"""Tools and verify of example_single_tool_call, called in-process through the ASGI app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from polygym import (
    ServerCallError,
    function_call_item,
    function_call_output_item,
    message_item,
    new_response,
    testing,
)
from polygym.testing import ServerClient, read_jsonl, serve_in_process
from resources_servers.example_single_tool_call.app import ExampleSingleToolCall

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = read_jsonl(DATA / "example.jsonl")
CITY_IN_PROMPT = re.compile(r"weather in ([A-Z][a-z]+(?: [A-Z][a-z]+)*)[?.,!]")


@pytest.fixture
async def env():
    async with serve_in_process(ExampleSingleToolCall("example_single_tool_call", {})) as client:
        yield client


def rollout(city: Any, answer: str | None = "It is mild today.", raw_arguments: str | None = None) -> dict:
    """A Responses object: one get_weather call (unless city is None), its output, then an answer."""
    output: list[dict] = []
    if city is not None or raw_arguments is not None:
        call = function_call_item(
            "get_weather", raw_arguments if raw_arguments is not None else {"city": city}
        )
        output += [call, function_call_output_item(call["call_id"], '{"weather_description": "sunny"}')]
    if answer is not None:
        output.append(message_item(answer))
    return new_response(output, model="scripted")


async def verify(client: ServerClient, row: dict, response: dict) -> dict:
    """Verify inside a seeded session, released afterwards, the way an agent does."""
    seed = await client.call("env", "/seed_session", row)
    result = await testing.verify(client, row, response, seed.cookies)
    await client.call("env", "/end_session", {}, cookies=seed.cookies)
    return result


@pytest.mark.parametrize("row", ROWS, ids=[r["expected_city"] for r in ROWS])
async def test_correct_rollout_gets_reward_one_for_every_row(env, row):
    seed = await env.call("env", "/seed_session", row)
    tool = await env.call("env", "/get_weather", {"city": row["expected_city"]}, cookies=seed.cookies)
    answer = f"In {row['expected_city']} it is {tool.json()['weather_description']}."
    result = await verify(env, row, rollout(row["expected_city"], answer))
    assert result["reward"] == 1.0
    assert result["called_tool"] is True
    assert result["called_city"] == row["expected_city"]
    assert result["answered"] is True
    assert result["expected_city"] == row["expected_city"]  # the row is echoed back


async def test_city_match_ignores_case_and_whitespace(env):
    result = await verify(env, ROWS[0], rollout(f"  {ROWS[0]['expected_city'].upper()}  "))
    assert result["reward"] == 1.0


@pytest.mark.parametrize(
    ("make_response", "called_tool", "answered"),
    [
        (lambda city: rollout("Atlantis"), True, True),
        (lambda city: rollout(None, "I think it is sunny."), False, True),
        (lambda city: rollout(city, answer=None), True, False),
        (lambda city: rollout(city, answer="   "), True, False),
        (lambda city: rollout(None, raw_arguments='{"city": "' + city), True, True),
        (lambda city: rollout(None, raw_arguments='{"city": 42}'), True, True),
        (lambda city: new_response([], model="scripted"), False, False),
    ],
    ids=["wrong-city", "no-tool-call", "no-answer", "blank-answer", "invalid-json", "non-string", "empty"],
)
async def test_reward_zero_cases(env, make_response, called_tool, answered):
    row = ROWS[0]
    result = await verify(env, row, make_response(row["expected_city"]))
    assert result["reward"] == 0.0
    assert result["called_tool"] is called_tool
    assert result["answered"] is answered


async def test_last_call_decides_the_city(env):
    row = ROWS[0]
    first = function_call_item("get_weather", {"city": row["expected_city"]})
    second = function_call_item("get_weather", {"city": "Atlantis"})
    response = new_response([first, second, message_item("Done.")], model="scripted")
    result = await verify(env, row, response)
    assert result["reward"] == 0.0
    assert result["called_city"] == "Atlantis"


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        (rollout("Atlantis", answer=None), 1.0),
        (rollout(None, raw_arguments="{not json"), 1.0),
        (rollout(None, "It is sunny."), 0.0),
    ],
    ids=["any-city-no-answer", "malformed-call", "no-call"],
)
async def test_row_without_expected_city_is_scored_as_nemo_gym_does(env, response, reward):
    """NeMo Gym's rows carry no expected_city; its verifier rewards any get_weather call."""
    row = {k: v for k, v in ROWS[0].items() if k != "expected_city"}
    result = await verify(env, row, response)
    assert result["reward"] == reward


@pytest.mark.parametrize(
    "body", [{}, {"city": 42}, {"town": "Oslo"}], ids=["missing", "wrong-type", "wrong-name"]
)
async def test_tool_rejects_bad_arguments_with_422(env, body):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/get_weather", body)
    assert err.value.status == 422
    assert "city" in err.value.detail


async def test_tool_output_is_nemo_gyms_sentence(env):
    reply = (await env.call("env", "/get_weather", {"city": "Oslo"})).json()
    assert reply == {"city": "Oslo", "weather_description": "The weather in Oslo is cold."}


async def test_tools_listing_matches_dataset_schemas(env):
    listed = (await env.call("env", "/tools", method="GET")).json()
    assert [t["name"] for t in listed] == ["get_weather"]
    assert all(row["responses_create_params"]["tools"] == listed for row in ROWS)


def test_dataset_has_five_valid_rows_with_parsable_prompts():
    assert len(ROWS) == 5
    for row in ROWS:
        messages = row["responses_create_params"]["input"]
        assert [m["role"] for m in messages] in (["system", "user"], ["developer", "user"])
        assert "get_weather" in messages[0]["content"]
        found = CITY_IN_PROMPT.findall(messages[-1]["content"])
        assert found == [row["expected_city"]], messages[-1]["content"]
        assert row["agent_ref"] == {
            "type": "responses_api_agents",
            "name": "example_single_tool_call_simple_agent",
        }
    assert len({row["expected_city"] for row in ROWS}) == 5
    assert len({row["responses_create_params"]["input"][-1]["content"] for row in ROWS}) == 5


@pytest.mark.slow
def test_generator_reproduces_the_file_byte_for_byte(tmp_path):
    testing.assert_generator_reproduces(DATA, tmp_path)


async def test_a_stored_result_sent_again_gets_a_fresh_verdict(env):
    """``gym eval reverify`` (and NeMo Gym's) sends a stored rollout, earlier verdict included."""
    row = ROWS[0]
    first = await verify(env, row, rollout(row["expected_city"], f"{row['expected_city']}: sunny."))
    assert first["reward"] == 1.0 and first["called_tool"] is True
    stored = {k: v for k, v in first.items() if k != "response"}
    again = await verify(env, stored, rollout(None, "No idea."))
    assert again["reward"] == 0.0 and again["called_tool"] is False and again["called_city"] is None
