"""Tools and verify of example_multi_step, called in-process through the ASGI app."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from polygym import ServerCallError, function_call_item, function_call_output_item, message_item, new_response
from polygym.testing import assert_generator_reproduces, read_jsonl, serve_in_process, verify
from resources_servers.example_multi_step.app import ExampleMultiStep, synonym_value

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = read_jsonl(DATA / "example.jsonl")
WORDS_IN_PROMPT = re.compile(r"synonyms: ([a-z]+(?:, [a-z]+)*)\.")


@pytest.fixture
async def env():
    async with serve_in_process(ExampleMultiStep("example_multi_step", {})) as client:
        yield client


def rollout(words: list[str], submissions: list[object], answer: str | None = "Submitted.") -> dict:
    """Lookups of ``words``, then one extract_synonym_values call per entry of ``submissions``.

    A submission that is a string is sent verbatim as the call's raw ``arguments``.
    """
    output: list[dict] = []
    for word in words:
        call = function_call_item("get_synonym_value", {"synonym": word})
        value = json.dumps({"synonym_value": synonym_value(word)})
        output += [call, function_call_output_item(call["call_id"], value)]
    for values in submissions:
        args = values if isinstance(values, str) else {"synonym_values": values}
        call = function_call_item("extract_synonym_values", args)
        output += [call, function_call_output_item(call["call_id"], '{"success": true}')]
    if answer is not None:
        output.append(message_item(answer))
    return new_response(output, model="scripted")


@pytest.mark.parametrize("row", ROWS, ids=[",".join(r["expected_synonyms"]) for r in ROWS])
async def test_correct_rollout_gets_reward_one_for_every_row(env, row):
    seed = await env.call("env", "/seed_session", row)
    values = []
    for word in row["expected_synonyms"]:
        reply = await env.call("env", "/get_synonym_value", {"synonym": word}, cookies=seed.cookies)
        values.append(reply.json()["synonym_value"])
    assert values == row["expected_synonym_values"]
    submit = await env.call(
        "env", "/extract_synonym_values", {"synonym_values": values}, cookies=seed.cookies
    )
    assert submit.json() == {"success": True}

    result = await verify(env, row, rollout(row["expected_synonyms"], [values]), seed.cookies)
    assert result["reward"] == 1.0
    assert result["ordered_match"] is True
    assert result["set_overlap"] == 1.0
    assert result["extracted_synonym_values"] == values
    assert result["num_lookups"] == len(values)
    assert result["recorded_synonym_values"] == values
    assert result["expected_synonyms"] == row["expected_synonyms"]  # the row is echoed back
    assert (await env.call("env", "/end_session", {}, cookies=seed.cookies)).json() == {"released": True}


@pytest.mark.parametrize(
    ("make_submissions", "extracted", "overlap"),
    [
        (lambda v: [v[::-1]], "as-submitted", 1.0),  # right values, wrong order
        (lambda v: [[x + 10_000 for x in v]], "as-submitted", 0.0),  # wrong values
        (lambda v: [v[:-1]], "as-submitted", None),  # one value missing
        (lambda v: [[*v, v[0]]], "as-submitted", 1.0),  # an extra value
        (lambda v: [], None, 0.0),  # never submitted
        (lambda v: [v, v[::-1]], "as-submitted", 1.0),  # the last submission counts
        (lambda v: ['{"synonym_values": [1, 2'], None, 0.0),  # invalid JSON arguments
        (lambda v: [json.dumps({"synonym_values": [str(x) for x in v]})], None, 0.0),  # strings, not ints
        (lambda v: ['{"values": [1]}'], None, 0.0),  # wrong field name
    ],
    ids=["order", "values", "missing", "extra", "none", "last-wins", "bad-json", "strings", "field"],
)
async def test_reward_zero_cases(env, make_submissions, extracted, overlap):
    row = ROWS[0]
    expected = row["expected_synonym_values"]
    submissions = make_submissions(expected)
    result = await verify(env, row, rollout(row["expected_synonyms"], submissions))
    assert result["reward"] == 0.0
    assert result["ordered_match"] is False
    if extracted == "as-submitted":
        assert result["extracted_synonym_values"] == submissions[-1]
    else:
        assert result["extracted_synonym_values"] is None
    want = overlap if overlap is not None else (len(expected) - 1) / len(expected)
    assert result["set_overlap"] == pytest.approx(want)
    assert result["num_lookups"] == len(expected)


async def test_submission_without_lookups_still_counts_but_reports_zero_lookups(env):
    row = ROWS[1]
    result = await verify(env, row, rollout([], [row["expected_synonym_values"]], answer=None))
    assert result["reward"] == 1.0
    assert result["num_lookups"] == 0


async def test_verify_without_expected_fields_is_422_naming_them(env):
    row = {k: v for k, v in ROWS[0].items() if not k.startswith("expected_")}
    with pytest.raises(ServerCallError) as err:
        await verify(env, row, rollout([], []))
    assert err.value.status == 422
    assert "expected_synonyms" in err.value.detail
    assert "expected_synonym_values" in err.value.detail


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/get_synonym_value", {}, "synonym"),
        ("/get_synonym_value", {"synonym": ["happy"]}, "synonym"),
        ("/extract_synonym_values", {}, "synonym_values"),
        ("/extract_synonym_values", {"synonym_values": "1, 2"}, "synonym_values"),
        ("/extract_synonym_values", {"synonym_values": ["12"]}, "synonym_values"),
    ],
    ids=["lookup-missing", "lookup-list", "submit-missing", "submit-string", "submit-string-items"],
)
async def test_tools_reject_bad_arguments_with_422(env, path, body, field):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", path, body)
    assert err.value.status == 422
    assert field in err.value.detail


async def test_lookup_is_nemo_gyms_code_point_sum(env):
    replies = [
        (await env.call("env", "/get_synonym_value", {"synonym": w})).json()
        for w in ("happy", "happy", "Blazing", " Happy ")
    ]
    # Pinned to NeMo Gym's values (its rows expect Blazing -> 711); case and spaces count there too.
    assert [r["synonym_value"] for r in replies] == [546, 546, 711, 578]


async def test_sessions_keep_their_submissions_apart(env):
    row = ROWS[0]
    first = await env.call("env", "/seed_session", row)
    second = await env.call("env", "/seed_session", row)
    assert first.cookies != second.cookies
    await env.call("env", "/extract_synonym_values", {"synonym_values": [1, 2, 3]}, cookies=first.cookies)
    await env.call("env", "/extract_synonym_values", {"synonym_values": [7]}, cookies=second.cookies)
    await env.call("env", "/extract_synonym_values", {"synonym_values": [4, 5]}, cookies=first.cookies)
    third = await env.call("env", "/seed_session", row)

    empty = rollout([], [])
    assert (await verify(env, row, empty, first.cookies))["recorded_synonym_values"] == [4, 5]
    assert (await verify(env, row, empty, second.cookies))["recorded_synonym_values"] == [7]
    assert (await verify(env, row, empty, third.cookies))["recorded_synonym_values"] is None

    await env.call("env", "/end_session", {}, cookies=first.cookies)
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/extract_synonym_values", {"synonym_values": [1]}, cookies=first.cookies)
    assert err.value.status == 409  # released state is gone, not silently recreated


async def test_tools_listing_matches_dataset_schemas(env):
    listed = (await env.call("env", "/tools", method="GET")).json()
    assert sorted(t["name"] for t in listed) == ["extract_synonym_values", "get_synonym_value"]
    assert all(row["responses_create_params"]["tools"] == listed for row in ROWS)


def test_dataset_has_five_valid_rows_with_parsable_prompts():
    assert len(ROWS) == 5
    for row in ROWS:
        messages = row["responses_create_params"]["input"]
        assert [m["role"] for m in messages] in (["system", "user"], ["developer", "user"])
        prompt = messages[-1]["content"]
        found = WORDS_IN_PROMPT.findall(prompt)
        assert len(found) == 1, prompt
        assert found[0].split(", ") == row["expected_synonyms"]
        assert 3 <= len(row["expected_synonyms"]) <= 5
        assert row["expected_synonym_values"] == [synonym_value(w) for w in row["expected_synonyms"]]
        assert len(set(row["expected_synonym_values"])) == len(row["expected_synonym_values"])
        assert "get_synonym_value" in prompt and "extract_synonym_values" in prompt
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "example_multi_step_simple_agent"}
    assert len({tuple(row["expected_synonyms"]) for row in ROWS}) == 5


@pytest.mark.slow
def test_generator_reproduces_the_file_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA, tmp_path)
