"""Counter sessions of example_session_state_mgmt, called in-process through the ASGI app."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

from polygym import ServerCallError, function_call_item, message_item, new_response
from polygym.testing import ServerClient, assert_generator_reproduces, in_process_client, read_splits, verify
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt, reported_value

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SPLITS = {"example": 5, "train": 200, "validation": 50}
LOADED = read_splits(DATA_DIR, SPLITS)
ROWS = LOADED["example"]
AMOUNTS_IN_PROMPT = re.compile(r"amounts: (-?\d+(?:, -?\d+)*)\.")


@pytest.fixture
async def server():
    server = ExampleSessionStateMgmt("example_session_state_mgmt", {})
    async with server.app.router.lifespan_context(server.app):
        yield server


@pytest.fixture
def env(server):
    return in_process_client(server)


async def play(client: ServerClient, row: dict, amounts: list[int]) -> dict:
    """Seed a session and apply ``amounts`` through the tools; returns the session cookies."""
    seed = await client.call("env", "/seed_session", row)
    for amount in amounts:
        await client.call("env", "/increment", {"amount": amount}, cookies=seed.cookies)
    return seed.cookies


@pytest.mark.parametrize("row", ROWS, ids=[str(r["increments"]) for r in ROWS])
async def test_example_solution_gets_reward_one_with_a_session_and_by_replay(env, row):
    cookies = await play(env, row, row["increments"])
    value = (await env.call("env", "/get_value", {}, cookies=cookies)).json()
    assert value == {"value": row["expected_final_value"]}
    output = ExampleSessionStateMgmt.example_solution(row)

    result = await verify(env, row, output, cookies)
    assert result["reward"] == 1.0
    assert result["value_source"] == "session"
    assert result["final_value"] == result["reported_value"] == row["expected_final_value"]
    assert result["num_increments"] == len(row["increments"])
    assert result["increments"] == row["increments"]  # the row is echoed back
    assert (await env.call("env", "/end_session", {}, cookies=cookies)).json() == {"released": True}

    replayed = await verify(env, row, output)  # no cookie: the rollout's own calls are replayed
    assert replayed["reward"] == 1.0
    assert replayed["value_source"] == "replay"
    assert replayed["num_increments"] == len(row["increments"])


async def test_the_session_not_the_transcript_decides(env):
    """Tool calls that never reached the server do not count when a seeded session exists."""
    row = ROWS[0]
    cookies = await play(env, row, row["increments"][:-1])
    result = await verify(env, row, ExampleSessionStateMgmt.example_solution(row), cookies)
    assert result["reward"] == 0.0
    assert result["counter_correct"] is False
    assert result["answer_correct"] is True
    assert result["final_value"] == row["expected_final_value"] - row["increments"][-1]


@pytest.mark.parametrize(
    ("answer", "reported"),
    [
        ("Final value: {v}", "v"),
        ("final VALUE is {v} after 3 increments", "v"),
        ("The counter now reads {v}.", "v"),
        ("<think>maybe 7</think>Final value: {v}", "v"),
        ("Final value: {w}", "w"),
        ("I could not finish.", None),
        ("", None),
    ],
)
async def test_the_answer_must_report_the_value(env, answer, reported):
    row = ROWS[1]
    cookies = await play(env, row, row["increments"])
    v, w = row["expected_final_value"], row["expected_final_value"] + 1
    output = [message_item(answer.format(v=v, w=w))]
    result = await verify(env, row, output, cookies)
    want = {"v": v, "w": w, None: None}[reported]
    assert result["reported_value"] == want
    assert result["counter_correct"] is True
    assert result["reward"] == (1.0 if want == v else 0.0)


def test_reported_value_ignores_decimals_and_giant_numbers():
    assert reported_value("It is 3.5 or 12") == 12
    assert reported_value("Final value: 12.5") is None
    assert reported_value("9" * 5000) is None  # beyond 18 digits: not an integer we parse
    assert reported_value("Final value: \u221242") == -42


async def test_example_solution_for_a_row_without_increments(env):
    row = {k: v for k, v in ROWS[0].items() if k != "increments"}
    result = await verify(env, row, ExampleSessionStateMgmt.example_solution(row))
    assert (result["reward"], result["num_increments"]) == (1.0, 1)


async def test_doing_nothing_gets_zero(env):
    row = ROWS[2]
    cookies = await play(env, row, [])
    result = await verify(env, row, [message_item(f"Final value: {row['initial_value']}")], cookies)
    assert result["reward"] == 0.0
    assert result["final_value"] == row["initial_value"]


async def test_replay_counts_only_calls_the_tool_would_accept(env):
    row = {**ROWS[0], "initial_value": 10, "increments": [5], "expected_final_value": 15}
    output = [
        function_call_item("increment", {"amount": 5}),
        function_call_item("increment", {"amount": "5"}),  # string: the tool answers 422
        function_call_item("increment", {"amount": 5, "note": "x"}),  # unknown field: 422
        function_call_item("increment", '{"amount": 5'),  # invalid JSON
        function_call_item("increment", {"amount": 10**7}),  # out of range: 422
        function_call_item("get_value", {"amount": 5}),
        message_item("Final value: 15"),
    ]
    result = await verify(env, row, output)
    assert (result["reward"], result["final_value"], result["num_increments"]) == (1.0, 15, 1)


async def test_many_concurrent_interleaved_sessions_keep_their_own_counters(env, server):
    rows = LOADED["train"][:40]
    seeds = [await env.call("env", "/seed_session", row) for row in rows]
    steps = [(i, amount) for i, row in enumerate(rows) for amount in row["increments"]]
    random.Random(3).shuffle(steps)  # every session's calls interleaved with everyone else's

    async def step(i: int, amount: int) -> None:
        await env.call("env", "/increment", {"amount": amount}, cookies=seeds[i].cookies)

    await asyncio.gather(*(step(i, amount) for i, amount in steps))
    results = await asyncio.gather(
        *(
            verify(env, row, ExampleSessionStateMgmt.example_solution(row), seed.cookies)
            for row, seed in zip(rows, seeds, strict=True)
        )
    )
    assert [r["final_value"] for r in results] == [row["expected_final_value"] for row in rows]
    assert all(r["reward"] == 1.0 and r["value_source"] == "session" for r in results)
    assert len({tuple(sorted(s.cookies.items())) for s in seeds}) == len(rows)
    # /verify released every session (NeMo Gym's agents never end them)
    assert server.sessions.stats()["active"] == 0
    for seed in seeds:  # ending a session /verify released is still answered, and not counted twice
        assert (await env.call("env", "/end_session", {}, cookies=seed.cookies)).json() == {"released": True}
    assert server.sessions.stats()["active"] == 0
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/get_value", {}, cookies=seeds[0].cookies)
    assert err.value.status == 409  # released state is gone, not silently recreated


async def test_cookieless_verify_and_seed_default_leave_no_session_behind(env, server):
    await verify(env, ROWS[0], [])
    seed = await env.call("env", "/seed_session", {"responses_create_params": {"input": "hi"}})
    assert (await env.call("env", "/get_value", {}, cookies=seed.cookies)).json() == {"value": 0}
    await env.call("env", "/end_session", {}, cookies=seed.cookies)
    assert server.sessions.stats()["active"] == 0


@pytest.mark.parametrize("initial", ["5", 1.5, True, 10**12, None])
async def test_seed_rejects_a_bad_initial_value_without_leaking_a_session(env, server, initial):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/seed_session", {**ROWS[0], "initial_value": initial})
    assert err.value.status == 422
    assert "initial_value" in err.value.detail
    assert server.sessions.stats()["active"] == 0


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/increment", {}, "amount"),
        ("/increment", {"amount": "3"}, "amount"),
        ("/increment", {"amount": 2.5}, "amount"),
        ("/increment", {"amount": 10**7}, "amount"),
        ("/increment", {"amount": 1, "extra": 2}, "extra"),
        ("/get_value", {"x": 1}, "x"),
        ("/get_value", [1, 2], "(body)"),
    ],
)
async def test_tools_reject_bad_arguments_with_422(env, path, body, field):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", path, body)
    assert err.value.status == 422
    assert field in err.value.detail


@pytest.mark.parametrize(
    "patch",
    [
        {"response": "not a response"},
        {"response": {"output": "nope"}},
        {"response": {"output": [1, 2]}},
        {"expected_final_value": "28"},
        {"initial_value": None},
        {"responses_create_params": None},
    ],
    ids=["response-str", "output-str", "output-ints", "expected-str", "initial-null", "params-null"],
)
async def test_malformed_verify_bodies_get_422(env, patch):
    body = {**ROWS[0], "response": new_response([], model="scripted"), **patch}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422


@pytest.mark.parametrize(
    "output",
    [
        [],
        [message_item("")],
        [message_item("x" * 1_000_000 + " 42")],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": None}]}],
        [{"type": "message", "role": "assistant", "content": 17}],
        [{"type": "function_call", "name": "increment", "arguments": {"amount": 5}}],
        [{"type": "function_call", "name": 5, "arguments": None}],
        [{"unexpected": True}],
    ],
    ids=["empty", "blank", "1MB", "null-text", "int-content", "dict-arguments", "junk-call", "junk-item"],
)
async def test_garbage_output_gets_reward_zero(env, output):
    result = await verify(env, ROWS[0], output)
    assert result["reward"] == 0.0


async def test_verify_is_deterministic(env):
    row = ROWS[3]
    body = {**row, "response": new_response(ExampleSessionStateMgmt.example_solution(row), model="m")}
    first, second = [(await env.call("env", "/verify", body)).json() for _ in range(2)]
    assert first == second
    assert first["reward"] == 1.0


async def test_tools_listing_matches_dataset_schemas(env):
    listed = (await env.call("env", "/tools", method="GET")).json()
    assert [t["name"] for t in listed] == ["increment", "get_value", "increment_counter", "get_counter_value"]
    own = listed[:2]  # polygym's rows offer its own two; NeMo Gym's rows bring the other two
    assert all(row["responses_create_params"]["tools"] == own for rows in LOADED.values() for row in rows)


def test_datasets_have_the_right_sizes_valid_rows_and_disjoint_splits():
    assert {split: len(rows) for split, rows in LOADED.items()} == SPLITS
    seen: set[tuple[int, ...]] = set()
    for rows in LOADED.values():
        for row in rows:
            prompt = row["responses_create_params"]["input"][-1]["content"]
            found = AMOUNTS_IN_PROMPT.findall(prompt)
            assert [list(map(int, f.split(", "))) for f in found] == [row["increments"]], prompt
            assert str(row["initial_value"]) not in re.findall(r"-?\d+", prompt.split("amounts:")[0])
            assert row["expected_final_value"] == row["initial_value"] + sum(row["increments"])
            assert sum(row["increments"]) != 0 and 0 not in row["increments"]
            assert row["agent_ref"]["name"] == "example_session_state_mgmt_simple_agent"
            key = tuple(row["increments"])
            assert key not in seen
            seen.add(key)


@pytest.mark.slow
def test_generator_reproduces_every_file_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA_DIR, tmp_path)


NEMO_GYM_ROW = {  # the shape of NeMo Gym's rows: initial_count seeds, expected_count is checked
    "responses_create_params": {
        "input": [{"role": "user", "content": "add 1 then add 2 then get the count"}]
    },
    "initial_count": 3,
    "expected_count": 6,
}


async def test_nemo_gym_row_with_nemo_gym_tools(env):
    seed = await env.call("env", "/seed_session", NEMO_GYM_ROW)
    for count in (1, 2):
        reply = await env.call("env", "/increment_counter", {"count": count}, cookies=seed.cookies)
        assert reply.json() == {"success": True}
    assert (await env.call("env", "/get_counter_value", {}, cookies=seed.cookies)).json() == {"count": 6}
    output = ExampleSessionStateMgmt.example_solution(NEMO_GYM_ROW)
    assert (await verify(env, NEMO_GYM_ROW, output, seed.cookies))["reward"] == 1.0
    no_answer = [item for item in output if item["type"] != "message"]
    assert (await verify(env, NEMO_GYM_ROW, no_answer))["reward"] == 1.0  # replayed; the answer is not read


async def test_nemo_gym_row_with_the_wrong_count_gets_zero(env):
    seed = await env.call("env", "/seed_session", NEMO_GYM_ROW)
    await env.call("env", "/increment_counter", {"count": 2}, cookies=seed.cookies)
    assert (await verify(env, NEMO_GYM_ROW, [message_item("The count is 6.")], seed.cookies))["reward"] == 0.0


async def test_a_row_needs_exactly_one_expectation(env):
    body = {**NEMO_GYM_ROW, "expected_final_value": 6, "response": new_response([], model="m")}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422
    assert "exactly one" in err.value.detail
