"""verify and aggregate_metrics of math_with_verify, called in-process through the ASGI app.

One server (and so one worker pool, whose workers import sympy once) serves the whole module:
starting worker processes is the slow part of these tests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import pytest_asyncio

from polygym import ServerCallError, message_item
from polygym.testing import read_jsonl, serve_in_process, synthetic_response, verify
from resources_servers.math_with_verify.app import MathWithVerify

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROWS = read_jsonl(Path(__file__).resolve().parents[1] / "data" / "example.jsonl")
FRACTION_ROW = next(r for r in ROWS if r["expected_answer"] == "25/3")
NEGATIVE_ROW = next(r for r in ROWS if r["expected_answer"] == "-35/6")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env():
    async with serve_in_process(MathWithVerify("math_with_verify", {"cpu_workers": 1})) as client:
        yield client


def body_for(row: dict, output: list[dict]) -> dict:
    return {**row, "response": synthetic_response(output)}


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r["expected_answer"] for r in ROWS])
async def test_example_solution_gets_reward_one_for_every_row(env, row):
    result = await verify(env, row, MathWithVerify.example_solution(row))
    assert result["reward"] == 1.0
    assert result["extracted_answer"] == row["expected_answer"]
    assert result["grading_error"] is None
    assert result["problem_type"] == row["problem_type"]  # the row is echoed back


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        ("Each jug holds $\\boxed{\\frac{25}{3}}$ liters.", "25/3"),
        ("\\boxed{25/3}", "25/3"),
        ("Answer: 25/3", "25/3"),
        ("Some work first.\n**Answer:** $\\dfrac{50}{6}$", "25/3"),
        ("The final answer is 8.333333", "8333333/1000000"),
        ("<think>Maybe \\boxed{7}?</think>So each jug gets \\boxed{25/3}.", "25/3"),
        ("First I guessed 8, but the answer is \\boxed{25/3}. Not 9.", "25/3"),
    ],
    ids=["boxed-frac", "boxed-slash", "answer-colon", "bold-answer-dfrac", "decimal", "think", "boxed-wins"],
)
async def test_answer_forms_that_match(env, text, extracted):
    result = await verify(env, FRACTION_ROW, text)
    assert result["reward"] == 1.0, result["extracted_text"]
    assert result["extracted_answer"] == extracted


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        ("\\boxed{8}", "8"),
        ("Answer: 8.33", "833/100"),
        ("Answer: 3/25", "3/25"),
        ("I am not sure.", None),
        ("", None),
    ],
    ids=["wrong-int", "rounded", "swapped", "no-number", "empty"],
)
async def test_wrong_or_missing_answers_get_zero(env, text, extracted):
    result = await verify(env, FRACTION_ROW, text)
    assert result["reward"] == 0.0
    assert result["extracted_answer"] == extracted


async def test_negative_fractions_and_equations(env):
    for text in ("\\boxed{-\\frac{35}{6}}", "\\boxed{x = -35/6}", "Answer: -35/6", "Answer: x = -5.833333"):
        assert (await verify(env, NEGATIVE_ROW, text))["reward"] == 1.0, text
    assert (await verify(env, NEGATIVE_ROW, "\\boxed{35/6}"))["reward"] == 0.0


@pytest.mark.parametrize(
    ("expected", "text"), [(57, "\\boxed{57}"), (0.75, "Answer: 3/4"), ("  3/4 ", "Answer: 0.75")]
)
async def test_numeric_and_padded_expected_answers_are_accepted(env, expected, text):
    result = await verify(env, {**ROWS[0], "expected_answer": expected}, text)
    assert result["reward"] == 1.0


@pytest.mark.parametrize(
    ("expected", "needle"),
    [("", "expected_answer"), (None, "expected_answer"), (True, "expected_answer"),
     ([3], "expected_answer"), (float("inf"), "expected_answer"), ("\\boxed{}", "could not parse"),
     ("???", "could not parse"), ("x" * 2000, "expected_answer")],
    ids=["empty", "null", "bool", "list", "inf", "empty-boxed", "not-math", "too-long"],
)  # fmt: skip
async def test_bad_expected_answer_is_422(env, expected, needle):
    body = body_for(ROWS[0], [message_item("\\boxed{1}")])
    body["expected_answer"] = expected
    if expected == float("inf"):
        raw = json.dumps(body).replace("Infinity", "1e999")  # JSON has no infinity; 1e999 overflows to it
        body = json.loads(raw)
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422
    assert needle in err.value.detail


async def test_missing_expected_answer_is_422_naming_it(env):
    row = {k: v for k, v in ROWS[0].items() if k != "expected_answer"}
    with pytest.raises(ServerCallError) as err:
        await verify(env, row, "\\boxed{57}")
    assert err.value.status == 422
    assert "expected_answer" in err.value.detail


@pytest.mark.parametrize(
    "output",
    [
        [],
        [message_item("x" * 1_000_000)],
        [message_item("1 + " * 250_000 + "\\boxed{57")],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": None}]}],
        [{"type": "message", "role": "assistant", "content": 17}],
        [{"type": "function_call", "name": "calculator", "arguments": "{}"}],
        [{"junk": True}],
    ],
    ids=["empty", "1MB", "1MB-unclosed-boxed", "null-text", "int-content", "tool-call-only", "junk-item"],
)
async def test_garbage_output_gets_reward_zero(env, output):
    result = await verify(env, ROWS[0], output)
    assert result["reward"] == 0.0


@pytest.mark.parametrize(
    "patch",
    [{"response": "nope"}, {"response": {"output": [1]}}, {"responses_create_params": {}}],
    ids=["response-str", "output-ints", "no-input"],
)
async def test_malformed_bodies_get_422(env, patch):
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", {**body_for(ROWS[0], []), **patch})
    assert err.value.status == 422


async def test_restating_the_question_earns_nothing(env):
    row = {**ROWS[0], "expected_answer": "7/6"}
    result = await verify(env, row, "Scripted reply to: Compute 3/2 - 3/9.")
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


async def test_verify_is_deterministic(env):
    body = body_for(FRACTION_ROW, [message_item("So \\boxed{25/3}.")])
    first, second = [(await env.call("env", "/verify", body)).json() for _ in range(2)]
    assert first == second


@pytest.mark.slow
async def test_a_verification_past_its_time_limit_is_stopped_and_the_next_one_works():
    """sympy evaluating 9^(9^(9^9)) never yields to math-verify's own alarms: only the kill stops it."""
    server = MathWithVerify("math_with_verify", {"cpu_workers": 1, "verify_timeout_s": 4})
    async with serve_in_process(server) as client:
        await verify(client, ROWS[0], "\\boxed{57}")  # warm the worker up (imports sympy)
        started = time.monotonic()
        bomb = await verify(client, ROWS[0], "\\boxed{9^{9^{9^{9}}}}")
        assert time.monotonic() - started < 15
        after = await verify(client, ROWS[0], "\\boxed{57}")
    assert (bomb["reward"], bomb["extracted_answer"]) == (0.0, None)
    assert bomb["grading_error"].startswith("timeout")
    assert (after["reward"], after["grading_error"]) == (1.0, None)  # served by a replacement worker


async def test_aggregate_metrics_report_pass_and_majority_at_k(env):
    rollouts = []
    for task, (row, texts) in enumerate(
        [
            (FRACTION_ROW, ["\\boxed{25/3}", "Answer: 8", "Answer: 8", "\\boxed{50/6}"]),
            (ROWS[0], ["\\boxed{57}", "Answer: 57.0", "no idea", "\\boxed{56}"]),
        ]
    ):
        for index, text in enumerate(texts):
            result = await verify(env, row, text)
            rollouts.append({**result, "_ng_task_index": task, "_ng_rollout_index": index})
    metrics = (await env.call("env", "/aggregate_metrics", {"rollouts": rollouts})).json()
    agent = metrics["agent_metrics"]
    # task 0: 25/3 twice vs 8 twice, tie goes to the first seen (correct); task 1: 57 three times.
    assert agent["majority@4"] == 1.0
    assert agent["pass@1"] == pytest.approx((2 / 4 + 2 / 4) / 2)
    assert agent["pass@4"] == 1.0
    assert agent["mean/reward_by_type/word_division"] == 0.5
    assert agent["mean/reward_by_type/word_arithmetic"] == 0.5
    assert "majority@4" in metrics["key_metrics"]
