"""guess_number and the reset/step protocol of polygym.servers.episodic, in-process through ASGI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polygym import (
    MAX_ACTION_CHARS,
    EpisodicServer,
    ServerCallError,
    Session,
    function_call_item,
    function_call_output_item,
    message_item,
    new_response,
    split_turns,
    turn_action,
)
from polygym.testing import (
    ServerClient,
    assert_generator_reproduces,
    in_process_client,
    read_splits,
    serve_in_process,
    verify,
)
from resources_servers.guess_number.app import (
    GameSpec,
    GuessNumber,
    binary_search_guesses,
    intro,
    parse_guess,
)

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = read_splits(DATA)
NO_NUMBER = (
    "I could not find a whole number in your reply. Reply with a number from 1 to 100. 7 guesses left."
)
ROW = {
    "responses_create_params": {"input": [{"role": "system", "content": "play"}]},
    "game": {"low": 1, "high": 100, "secret": 37, "max_guesses": 8},
}


@pytest.fixture
async def env():
    async with serve_in_process(GuessNumber("guess_number", {})) as client:
        yield client


async def start(client: ServerClient, row: dict = ROW) -> tuple[dict[str, str], dict]:
    seed = await client.call("env", "/seed_session", row)
    reset = await client.call("env", "/reset", {}, cookies=seed.cookies)
    return seed.cookies, reset.json()


async def step(client: ServerClient, cookies: dict[str, str], action: Any) -> dict:
    return (await client.call("env", "/step", {"action": action}, cookies=cookies)).json()


async def test_binary_search_wins_and_verify_reads_the_session(env):
    cookies, reset = await start(env)
    assert reset["observation"] == intro(GameSpec(**ROW["game"]))
    assert reset["info"] == {"max_episode_steps": 50}
    guesses = binary_search_guesses(GameSpec(**ROW["game"]))
    replies = [await step(env, cookies, f"My guess: <guess>{g}</guess>") for g in guesses]
    assert [r["terminated"] for r in replies] == [False] * (len(guesses) - 1) + [True]
    assert [r["reward"] for r in replies] == [0.0] * (len(guesses) - 1) + [1.0]
    assert replies[0]["observation"] == "50 is too high. The number is lower. 7 guesses left."
    assert replies[-1]["observation"].startswith("Correct! The number was 37.")
    assert replies[-1]["info"]["won"] is True
    result = await verify(env, ROW, [], cookies)  # the session, not the (empty) output, decides
    assert result["reward"] == 1.0
    assert result["step_rewards"] == [r["reward"] for r in replies]
    assert result["num_steps"] == len(guesses)
    assert result["terminated"] is True and result["truncated"] is False
    assert result["reward_source"] == "session"
    assert result["game"] == ROW["game"]  # the row is echoed back
    assert (await env.call("env", "/end_session", {}, cookies=cookies)).json() == {"released": True}


async def test_running_out_of_guesses_loses(env):
    cookies, _ = await start(env)
    replies = [await step(env, cookies, "1") for _ in range(8)]
    assert replies[-1]["terminated"] is True
    assert "out of guesses: the number was 37" in replies[-1]["observation"]
    assert replies[-2]["observation"] == "1 is too low. The number is higher. 1 guess left."
    result = await verify(env, ROW, [], cookies)
    assert result["reward"] == 0.0 and result["num_steps"] == 8 and result["terminated"] is True


@pytest.mark.parametrize(
    ("action", "observation"),
    [
        (
            "no idea",
            NO_NUMBER,
        ),
        (
            "",
            NO_NUMBER,
        ),
        ("500", "500 is outside the range: the number is between 1 and 100. 7 guesses left."),
        ("9" * 5000, f"{10**18} is outside the range: the number is between 1 and 100. 7 guesses left."),
        (
            "x" * MAX_ACTION_CHARS,
            NO_NUMBER,
        ),
    ],
    ids=["prose", "empty", "out-of-range", "huge-number", "longest-action"],
)
async def test_invalid_guesses_cost_a_turn(env, action, observation):
    cookies, _ = await start(env)
    reply = await step(env, cookies, action)
    assert reply == {
        "observation": observation,
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "info": reply["info"],
    }
    assert reply["info"]["guesses_used"] == 1


@pytest.mark.parametrize(
    ("text", "guess"),
    [
        ("42", 42),
        ("I pick 10, no wait, 12", 12),
        ("<guess>7</guess> not 9", 7),
        ("<GUESS> -3 </guess>", -3),
        ("nothing", None),
        ("between 1 and 100 I say 64.", 64),
        ("1" * 30, 10**18),
    ],
)
def test_parse_guess(text, guess):
    assert parse_guess(text) == guess


async def test_step_before_reset_and_after_the_end_is_409(env):
    seed = await env.call("env", "/seed_session", ROW)
    with pytest.raises(ServerCallError) as err:
        await step(env, seed.cookies, "50")
    assert err.value.status == 409 and "/reset" in err.value.detail
    await env.call("env", "/reset", {}, cookies=seed.cookies)
    await step(env, seed.cookies, "37")
    with pytest.raises(ServerCallError) as err:
        await step(env, seed.cookies, "37")
    assert err.value.status == 409 and "over" in err.value.detail
    await env.call("env", "/reset", {}, cookies=seed.cookies)  # a new episode in the same session
    assert (await step(env, seed.cookies, "37"))["reward"] == 1.0


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "action"), ({"action": 5}, "action"), ({"action": "1" * (MAX_ACTION_CHARS + 1)}, "action")],
    ids=["missing", "not-a-string", "too-long"],
)
async def test_bad_step_bodies_are_422(env, body, field):
    cookies, _ = await start(env)
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/step", body, cookies=cookies)
    assert err.value.status == 422 and field in err.value.detail


async def test_reset_takes_the_row_in_the_body_without_a_session(env):
    reply = await env.call("env", "/reset", ROW)
    assert reply.cookies  # a fresh session was opened for it
    assert (await step(env, reply.cookies, "37"))["terminated"] is True


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "needs the dataset row"),
        ({**ROW, "game": {**ROW["game"], "secret": 500}}, "secret"),
        ({**ROW, "game": {**ROW["game"], "low": 100, "high": 1}}, "low"),
        ({**ROW, "game": None}, "game"),
        ({"responses_create_params": {"input": "x"}}, "game: Field required"),
        ([1, 2], "JSON object"),
    ],
    ids=["empty", "secret-outside", "low-above-high", "null-game", "no-game", "list"],
)
async def test_bad_reset_is_422(env, body, message):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/reset", body)
    assert err.value.status == 422
    assert message in err.value.detail


@pytest.mark.parametrize("row", ROWS["example"] + ROWS["validation"][:20])
async def test_example_solution_replays_to_a_win(env, row):
    result = await verify(env, row, GuessNumber.example_solution(row))
    assert result["reward"] == 1.0
    assert result["reward_source"] == "replay"
    assert result["step_rewards"][-1] == 1.0
    assert result["num_steps"] <= row["game"]["max_guesses"]


async def test_replay_reads_text_turns_and_skips_unusable_calls(env):
    bad_call = function_call_item("act", '{"action": ')  # invalid JSON: the agent stepped nothing
    output = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "intro"}]},
        message_item("I will try <guess>50</guess>"),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "lower"}]},
        bad_call,
        function_call_output_item(bad_call["call_id"], "Error: ..."),
        {"type": "reasoning", "summary": []},
        message_item("37"),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "correct"}]},
        message_item("thanks"),  # after the end: ignored
    ]
    result = await verify(env, ROW, output)
    assert result["step_rewards"] == [0.0, 1.0]
    assert result["reward"] == 1.0


@pytest.mark.parametrize(
    "output",
    [
        [],
        [message_item("x" * 1_000_000)],
        [message_item("50")] * 3,  # one turn (no observations between): one wrong guess
        [{"type": "unknown"}, {"no": "type"}],
        [message_item("1"), {"type": "function_call_output", "call_id": "c", "output": "o"}] * 200,
    ],
    ids=["empty", "1MB", "one-turn", "unknown-items", "many-turns"],
)
async def test_garbage_rollouts_verify_to_zero(env, output):
    result = await verify(env, ROW, output)
    assert result["reward"] == 0.0
    assert result["num_steps"] <= ROW["game"]["max_guesses"]


@pytest.mark.parametrize(
    "body",
    [
        {**ROW, "response": {"output": "nope"}},
        {**ROW, "response": {"output": [1, 2]}},
        {"game": ROW["game"], "response": new_response([], model="x")},
        {**ROW, "game": {"low": "a"}, "response": new_response([message_item("5")], model="x")},
    ],
    ids=["output-string", "output-ints", "no-params", "bad-game"],
)
async def test_malformed_verify_is_422(env, body):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422


async def test_verify_is_deterministic(env):
    output = GuessNumber.example_solution(ROW)[:3]  # one wrong guess, no win
    body = {**ROW, "response": new_response(output, model="scripted")}
    first, second = [(await env.call("env", "/verify", body)).json() for _ in range(2)]
    assert first == second and first["reward"] == 0.0 and first["num_steps"] == 1


async def test_the_base_truncates_long_episodes():
    client = in_process_client(GuessNumber("guess_number", {"max_episode_steps": 2}))
    seed = await client.call("env", "/seed_session", ROW)
    await client.call("env", "/reset", {}, cookies=seed.cookies)
    assert (await step(client, seed.cookies, "1"))["truncated"] is False
    last = await step(client, seed.cookies, "2")
    assert last["truncated"] is True and last["terminated"] is False
    result = await verify(client, ROW, [], seed.cookies)
    assert result["truncated"] is True and result["reward"] == 0.0


async def test_sessions_are_released(env):
    cookies, _ = await start(env)
    await verify(env, ROW, [], cookies)
    await env.call("env", "/end_session", {}, cookies=cookies)
    await verify(env, ROW, [message_item("37")])  # cookie-less: a throwaway session
    health = (await env.call("env", "/", method="GET")).json()
    assert health["sessions"]["active"] == 0
    with pytest.raises(ServerCallError) as err:
        await step(env, cookies, "37")
    assert err.value.status == 409


class TupleGame(EpisodicServer):
    """Steps return Gymnasium's 5-tuple; reward 0.5 per step, ends after two."""

    async def reset(self, row: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["n"] = 0
        return {"board": [0, 0]}

    async def step(self, action: str, session: Session) -> tuple[Any, float, bool, bool, dict]:
        session.state["n"] += 1
        return {"board": [session.state["n"], 0]}, 0.5, session.state["n"] == 2, False, {"echo": action}


async def test_subclasses_may_return_gymnasium_tuples_and_json_observations():
    server = TupleGame("tuple_game", {})
    client = in_process_client(server)
    reset = await client.call("env", "/reset", ROW)
    assert reset.json()["observation"] == {"board": [0, 0]}
    first = await step(client, reset.cookies, "a")
    assert first == {
        "observation": {"board": [1, 0]},
        "reward": 0.5,
        "terminated": False,
        "truncated": False,
        "info": {"echo": "a"},
    }
    await step(client, reset.cookies, "b")
    assert (await verify(client, ROW, [], reset.cookies))["reward"] == 1.0
    assert server.tool_schemas() == []


def test_turn_action_rule():
    call = function_call_item("act", {"action": 12})
    assert turn_action([message_item("ignored"), call]).action == "12"
    assert turn_action([call]).call_id == call["call_id"]
    assert turn_action([function_call_item("act", {"action": ["x"]})]).action is None
    assert turn_action([function_call_item("act", {"action": True})]).action is None
    assert turn_action([function_call_item("other", {"action": "1"}), message_item("7")]).action == "7"
    assert turn_action([]).action is None and turn_action([message_item("  ")]).error == "the reply was empty"
    assert turn_action([function_call_item("other", {})]).error == "call the act tool"
    assert (
        len(
            split_turns(
                [message_item("a"), message_item("b"), {"role": "user", "content": "o"}, message_item("c")]
            )
        )
        == 2
    )


def test_datasets_are_winnable_and_split():
    assert [len(ROWS[s]) for s in ("example", "train", "validation")] == [5, 500, 100]
    for row in ROWS["train"] + ROWS["validation"]:
        spec = GameSpec(**row["game"])
        assert len(binary_search_guesses(spec)) <= spec.max_guesses
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "guess_number_gymnasium_agent"}
    assert len({json.dumps(r["game"]) for r in ROWS["train"]}) > 250  # varied games


@pytest.mark.slow
def test_generator_reproduces_the_files_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA, tmp_path)
