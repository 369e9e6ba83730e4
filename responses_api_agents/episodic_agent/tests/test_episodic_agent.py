"""episodic_agent end to end: guess_number + the agent + the scripted model in one inline stack.

The scripted model plays from a per-request script (``metadata.script``). It counts model turns
since the last user message, so multi-step scripts play in ``tool`` mode (observations are
function_call_outputs); in ``text`` mode every observation is a user message and each turn plays
the script's first entry.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polygym import ServerCallError
from polygym.testing import ServerClient, Stack, collect_rollouts, inline_stack
from resources_servers.guess_number.app import GameSpec, binary_search_guesses

AGENT = "guess_number_gymnasium_agent"
TOOL_AGENT = "guess_number_tool_agent"
EXAMPLE = (
    Path(__file__).resolve().parents[3] / "resources_servers" / "guess_number" / "data" / "example.jsonl"
)
GAME = {"low": 1, "high": 100, "secret": 37, "max_guesses": 8}
EXTRA_CONFIG = f"""
{TOOL_AGENT}:
  responses_api_agents:
    episodic_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: guess_number}}
      model_server: {{type: responses_api_models, name: policy_model}}
      action_mode: tool
      max_steps: 12
short_agent:
  responses_api_agents:
    episodic_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: guess_number}}
      model_server: {{type: responses_api_models, name: policy_model}}
      max_steps: 3
"""


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    extra = tmp_path / "agents.yaml"
    extra.write_text(EXTRA_CONFIG)
    async with inline_stack(["guess_number"], ["scripted_model"], [extra]) as running:
        yield running


def row(script: list[dict[str, Any]] | None, game: dict[str, Any] = GAME) -> dict[str, Any]:
    params: dict[str, Any] = {"input": [{"role": "system", "content": "Play the game."}]}
    if script is not None:
        params["metadata"] = {"script": json.dumps(script)}
    return {"responses_create_params": params, "game": game}


async def run(stack: Stack, agent: str, body: dict[str, Any]) -> dict[str, Any]:
    assert stack.client is not None
    return (await stack.client.call(agent, "/run", body)).json()


async def active_sessions(client: ServerClient) -> int:
    return (await client.call("guess_number", "/", method="GET")).json()["sessions"]["active"]


def types(output: list[dict[str, Any]]) -> list[str]:
    return [item["type"] if item["type"] != "message" else f"message:{item['role']}" for item in output]


async def test_tool_mode_plays_a_multi_step_episode(stack):
    guesses = binary_search_guesses(GameSpec(**GAME))
    script = [{"tool": "act", "arguments": {"action": str(g)}} for g in guesses]
    result = await run(stack, TOOL_AGENT, row(script))
    assert result["reward"] == 1.0
    assert result["step_rewards"] == [0.0] * (len(guesses) - 1) + [1.0]
    assert result["reward_source"] == "session" and result["terminated"] is True
    response = result["response"]
    assert response["status"] == "completed"
    output = response["output"]
    assert types(output) == ["message:user"] + ["function_call", "function_call_output"] * len(guesses)
    assert output[0]["content"][0]["text"].startswith("I am thinking of a whole number between 1 and 100")
    calls, outputs = output[1::2], output[2::2]
    assert [json.loads(c["arguments"]) for c in calls] == [{"action": str(g)} for g in guesses]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
    assert outputs[0]["output"] == "50 is too high. The number is lower. 7 guesses left."
    assert outputs[-1]["output"].startswith("Correct! The number was 37.")
    usage = response["usage"]
    assert (
        usage["output_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    )
    assert await active_sessions(stack.client) == 0


async def test_text_mode_reads_the_reply_as_the_action(stack):
    result = await run(stack, AGENT, row([{"answer": "I guess <guess>37</guess>"}]))
    assert result["reward"] == 1.0 and result["num_steps"] == 1
    output = result["response"]["output"]
    assert types(output) == ["message:user", "message:assistant", "message:user"]
    assert output[-1]["content"][0]["text"].startswith("Correct!")


async def test_a_lost_game_ends_with_reward_zero(stack):
    result = await run(stack, AGENT, row([{"answer": "no idea"}]))
    assert result["reward"] == 0.0
    assert result["num_steps"] == GAME["max_guesses"] and result["terminated"] is True
    assert result["response"]["status"] == "completed"
    assert "out of guesses" in result["response"]["output"][-1]["content"][0]["text"]


async def test_agent_max_steps_marks_the_response_incomplete(stack):
    result = await run(stack, "short_agent", row([{"answer": "1"}]))
    assert result["reward"] == 0.0 and result["num_steps"] == 3
    assert result["terminated"] is False
    assert result["response"]["status"] == "incomplete"
    assert result["response"]["metadata"] == {"ng_termination_reason": "max_steps"}
    assert result["response"].get("incomplete_details") is None


async def test_model_mistakes_come_back_as_errors_and_replay_agrees(stack):
    script = [
        {"tool": "act", "arguments": '{"action": '},  # invalid JSON: no step
        {"tool": "lookup", "arguments": {"q": "x"}},  # not the act tool, no text: no step
        {"tool": "act", "arguments": {"action": "99"}},
        {"tool": "act", "arguments": {"action": "37"}},
    ]
    result = await run(stack, TOOL_AGENT, row(script))
    output = result["response"]["output"]
    assert types(output) == ["message:user"] + ["function_call", "function_call_output"] * 4
    assert output[2]["output"].startswith("Error: no action taken")
    assert (
        output[4]["output"] == "Error: there is no tool named 'lookup'. Use the act tool to take an action."
    )
    assert output[6]["output"] == "99 is too high. The number is lower. 7 guesses left."
    assert result["step_rewards"] == [0.0, 1.0]
    assert result["reward"] == 1.0
    # Re-verifying the saved rollout without its session replays it to the same result.
    body = {**row(script), "response": result["response"]}
    replayed = (await stack.client.call("guess_number", "/verify", body)).json()
    assert replayed["reward_source"] == "replay"
    assert replayed["step_rewards"] == result["step_rewards"] and replayed["reward"] == result["reward"]


async def test_empty_replies_are_not_steps(stack):
    result = await run(stack, "short_agent", row([{"answer": "   "}]))
    assert result["num_steps"] == 0 and result["reward"] == 0.0
    output = result["response"]["output"]
    assert types(output) == ["message:user"] + ["message:assistant", "message:user"] * 3
    assert output[2]["content"][0]["text"] == "Error: no action taken: the reply was empty."


async def test_bad_rows_are_4xx_and_release_their_session(stack):
    with pytest.raises(ServerCallError) as err:
        await run(stack, AGENT, {"responses_create_params": {"input": "hi"}})
    assert err.value.status == 422 and "game" in err.value.detail
    with pytest.raises(ServerCallError) as err:
        await run(stack, AGENT, {"game": GAME})
    assert err.value.status == 422 and "responses_create_params" in err.value.detail
    assert await active_sessions(stack.client) == 0


async def test_model_failure_fails_the_rollout_and_releases_the_session(stack):
    with pytest.raises(ServerCallError) as err:
        await run(stack, TOOL_AGENT, row([{"error": 400, "message": "scripted failure"}]))
    # a call the agent made failed: a 502 carrying the model server's answer as the class
    assert err.value.status == 502 and "scripted failure" in err.value.detail
    assert err.value.error_class == "HTTP 400"
    assert await active_sessions(stack.client) == 0


async def test_collect_runs_the_example_dataset(stack):
    assert stack.client is not None
    results = await collect_rollouts(stack.client, EXAMPLE, AGENT, num_repeats=2, concurrency=4)
    assert len(results) == 10 and all(r.ok for r in results)
    # No script: the scripted model echoes the last observation, whose last number is a guess count.
    for result in results:
        assert result.rollout is not None
        assert 0.0 <= result.rollout["reward"] <= 1.0
        assert result.rollout["response"]["output"][0]["role"] == "user"
    assert await active_sessions(stack.client) == 0


async def test_v1_responses_returns_only_the_episode(stack):
    assert stack.client is not None
    body = row([{"answer": "<guess>37</guess>"}])
    response = (await stack.client.call(AGENT, "/v1/responses", body)).json()
    assert response["object"] == "response" and response["status"] == "completed"
    assert types(response["output"]) == ["message:user", "message:assistant", "message:user"]
    assert "reward" not in response
    assert await active_sessions(stack.client) == 0
