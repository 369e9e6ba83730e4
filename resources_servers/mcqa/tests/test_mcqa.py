"""verify of mcqa under every extraction mode, called in-process through the ASGI app, and its data."""

from __future__ import annotations

import math
import re
from contextlib import AsyncExitStack
from fractions import Fraction
from pathlib import Path

import pytest

from polygym import ServerCallError, message_item, new_response
from polygym.testing import assert_generator_reproduces, read_splits, serve_in_process, verify
from resources_servers.mcqa.app import Mcqa, extract_letter, normalize_options

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SPLITS = {"example": 5, "train": 200, "validation": 50}
LOADED = read_splits(DATA_DIR, SPLITS)
ROWS = LOADED["example"]
ROW = {  # a hand-made row: answer C of four
    "responses_create_params": {"input": "Which is 2 + 2?"},
    "options": [{"A": "3"}, {"B": "5"}, {"C": "4"}, {"D": "22"}],
    "expected_answer": "C",
}


@pytest.fixture
async def make_env():
    """``make_env(**config)``: a client whose ``env`` is a fresh server with that config."""
    async with AsyncExitStack() as stack:

        async def make(**config):
            return await stack.enter_async_context(serve_in_process(Mcqa("mcqa", config)))

        yield make


@pytest.fixture
async def env(make_env):
    return await make_env()


@pytest.mark.parametrize("extraction", ["boxed", "answer_colon", "lenient"])
async def test_example_solution_gets_reward_one_for_every_row_in_every_mode(make_env, extraction):
    env = await make_env(extraction=extraction)
    for row in ROWS:
        result = await verify(env, row, Mcqa.example_solution(row))
        assert result["reward"] == 1.0
        assert result["extracted_answer"] == row["expected_answer"]
        assert result["extraction_used"] == extraction
        assert result["options"] == row["options"]  # the row is echoed back as written


# (text, letter under boxed, under answer_colon, under lenient)
CASES = [
    ("\\boxed{C}", "C", None, "C"),
    ("So it is $\\boxed{(C)}$.", "C", None, "C"),
    ("\\boxed{\\text{C}}", "C", None, "C"),
    ("\\boxed{c}", "C", None, "C"),
    ("\\boxed{C) 4}", "C", None, "C"),
    ("\\boxed{C. 4}", "C", None, "C"),
    ("\\boxed{A} no wait \\boxed{C}", "C", None, "C"),
    ("\\boxed{4}", None, None, None),
    ("\\boxed{A and C}", None, None, "C"),
    ("\\boxed{Cats}", None, None, None),
    ("\\boxed{F}", None, None, None),
    ("Answer: C", None, "C", "C"),
    ("**Answer:** (C)", None, "C", "C"),
    ("**Final Answer**: C", None, "C", "C"),
    ("The answer is: C.", None, "C", "C"),
    ("Answer: B\nHmm, actually Answer: C", None, "C", "C"),
    ("Answer: a stone", None, None, None),
    ("Answer: F", None, None, None),
    ("I'd go with C.", None, None, "C"),
    ("A is wrong and so is B; C it is", None, None, "C"),
    ("It's (C)", None, None, "C"),
    ("<think>Answer: A? \\boxed{A}</think>I pick C", None, None, "C"),
    ("I think the answer is 4.", None, None, None),
    ("", None, None, None),
]


@pytest.mark.parametrize(("text", "boxed", "answer_colon", "lenient"), CASES, ids=[c[0][:30] for c in CASES])
def test_extraction_modes(text, boxed, answer_colon, lenient):
    labels = "ABCD"
    assert extract_letter(text, labels, "boxed")[0] == boxed
    assert extract_letter(text, labels, "answer_colon")[0] == answer_colon
    assert extract_letter(text, labels, "lenient")[0] == lenient


def test_lenient_reports_which_rule_found_the_letter():
    assert extract_letter("Answer: B \\boxed{C}", "ABCD", "lenient") == ("C", "boxed")
    assert extract_letter("Answer: B then C", "ABCD", "lenient") == ("B", "answer_colon")
    assert extract_letter("B then C", "ABCD", "lenient") == ("C", "standalone_letter")
    assert extract_letter("It's E", "ABCDE", "lenient") == ("E", "standalone_letter")
    assert extract_letter("It's E", "ABCD", "lenient") == (None, None)  # E is not an option here


@pytest.mark.parametrize(
    ("extraction", "text", "reward"),
    [
        ("boxed", "\\boxed{C}", 1.0),
        ("boxed", "\\boxed{B}", 0.0),
        ("boxed", "Answer: C", 0.0),
        ("answer_colon", "Answer: C", 1.0),
        ("answer_colon", "\\boxed{C}", 0.0),
        ("lenient", "C", 1.0),
        ("lenient", "D", 0.0),
    ],
)
async def test_reward_follows_the_configured_extraction(make_env, extraction, text, reward):
    env = await make_env(extraction=extraction)
    result = await verify(env, ROW, text)
    assert result["reward"] == reward
    assert result["extraction_used"] == extraction


@pytest.mark.parametrize(
    ("grading_mode", "text", "reward", "used"),
    [
        ("strict_single_letter_boxed", "\\boxed{C}", 1.0, "boxed"),
        ("strict_single_letter_boxed", "Answer: C", 0.0, "boxed"),
        ("lenient_boxed", "\\boxed{\\text{ 4 }}", 1.0, "boxed_or_option_text"),
        ("lenient_boxed", "\\boxed{it is 22}", 0.0, "boxed_or_option_text"),  # names D
        ("lenient_answer_colon", "Answer: C", 1.0, "answer_colon"),
        ("lenient_answer_colon_md", "**Answer:** C", 1.0, "answer_colon"),
    ],
)
async def test_nemo_gym_grading_mode_picks_the_extraction(env, grading_mode, text, reward, used):
    result = await verify(env, {**ROW, "grading_mode": grading_mode, "uuid": "u-1"}, text)
    assert (result["reward"], result["extraction_used"], result["uuid"]) == (reward, used, "u-1")


def test_option_text_needs_exactly_one_matching_option():
    options = {"A": "Southern blotting", "B": "PCR", "C": "Methylation-specific PCR"}
    assert extract_letter("\\boxed{southern  Blotting}", "ABC", "boxed_or_option_text", options) == (
        "A",
        "option_text",
    )
    assert extract_letter("\\boxed{Methylation-specific PCR}", "ABC", "boxed_or_option_text", options) == (
        None,
        None,
    )  # B's text is inside C's: ambiguous, as in NeMo Gym


async def test_a_row_can_choose_its_extraction(env):
    assert (await verify(env, ROW, "Answer: C"))["reward"] == 0.0  # the config default is boxed
    result = await verify(env, {**ROW, "extraction": "answer_colon"}, "Answer: C")
    assert (result["reward"], result["extraction_used"]) == (1.0, "answer_colon")


@pytest.mark.parametrize(
    "options",
    [
        {"A": "3", "B": "5", "C": "4", "D": "22"},
        ["3", "5", "4", "22"],
        [{"A": "3"}, {"B": "5"}, {"C": "4"}],
    ],
    ids=["object", "list-of-texts", "list-of-objects"],
)
async def test_option_shapes(env, options):
    result = await verify(env, {**ROW, "options": options}, "\\boxed{C}")
    assert result["reward"] == 1.0
    assert normalize_options(options)["C"] == "4"


async def test_lower_case_expected_answer_is_accepted(env):
    assert (await verify(env, {**ROW, "expected_answer": "c"}, "\\boxed{C}"))["reward"] == 1.0


async def test_bad_config_value_is_rejected():
    with pytest.raises(ValueError, match="extraction"):
        Mcqa("mcqa", {"extraction": "fuzzy"})


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"expected_answer": "E"}, "not one of the options"),
        ({"expected_answer": 2}, "expected_answer"),
        ({"expected_answer": None}, "expected_answer"),
        ({"options": []}, "at least 2"),
        ({"options": "A) 3 B) 4"}, "options"),
        ({"options": [{"a": "3"}, {"B": "4"}]}, "single upper-case letter"),
        ({"options": [{"A": "3"}, {"A": "4"}]}, "twice"),
        ({"options": [{"A": 3}, {"B": "4"}]}, "must be text"),
        ({"options": [{"A": "3", "B": "4"}]}, "options"),
        ({"extraction": "fuzzy"}, "extraction"),
        ({"response": "nope"}, "response"),
        ({"response": {"output": [1]}}, "response"),
    ],
)
async def test_malformed_rows_get_422_with_a_clear_message(env, patch, needle):
    body = {**ROW, "response": new_response([], model="scripted"), **patch}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422
    assert needle in err.value.detail


async def test_missing_fields_are_named(env):
    with pytest.raises(ServerCallError) as err:
        await verify(env, {"responses_create_params": ROW["responses_create_params"]}, "\\boxed{C}")
    assert err.value.status == 422
    assert "options" in err.value.detail and "expected_answer" in err.value.detail


@pytest.mark.parametrize("extraction", ["boxed", "answer_colon", "lenient"])
@pytest.mark.parametrize(
    "output",
    [
        [],
        [message_item("")],
        [message_item("x " * 500_000)],
        [message_item("\\boxed{" * 100_000)],
        [message_item("answer" + " " * 1_000_000 + ":")],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": None}]}],
        [{"type": "message", "role": "assistant", "content": {"text": "C"}}],
        [{"type": "function_call", "name": "pick", "arguments": '{"letter": "C"}'}],
    ],
    ids=[
        "empty",
        "blank",
        "1MB",
        "1MB-unclosed-boxes",
        "1MB-spaces",
        "null-text",
        "dict-content",
        "tool-call",
    ],
)
async def test_garbage_output_gets_reward_zero(make_env, extraction, output):
    env = await make_env(extraction=extraction)
    assert (await verify(env, ROW, output))["reward"] == 0.0


async def test_verify_is_deterministic(env):
    body = {**ROW, "response": new_response([message_item("\\boxed{C}")], model="scripted")}
    first, second = [(await env.call("env", "/verify", body)).json() for _ in range(2)]
    assert first == second


async def test_aggregate_metrics_report_majority_at_k(env):
    rollouts = []
    for index, text in enumerate(["\\boxed{B}", "\\boxed{C}", "\\boxed{B}", "nothing"]):
        result = await verify(env, ROW, text)
        rollouts.append({**result, "_ng_task_index": 0, "_ng_rollout_index": index})
    metrics = (await env.call("env", "/aggregate_metrics", {"rollouts": rollouts})).json()
    assert metrics["agent_metrics"]["majority@4"] == 0.0  # B is the most common answer, and wrong
    assert metrics["agent_metrics"]["pass@4"] == 1.0
    assert metrics["agent_metrics"]["pass@1"] == 0.25


def _value(text: str) -> Fraction | None:
    return Fraction(text) if re.fullmatch(r"\d+(\.\d+)?|\d+/\d+", text) else None


def _check_correct_option(row: dict) -> None:
    """Re-derive the right option from the question text for the categories that allow it."""
    options = normalize_options(row["options"])
    correct = options[row["expected_answer"]]
    question = row["question"]
    if row["category"] == "primes":
        primes = [t for t in options.values() if all(int(t) % d for d in range(2, math.isqrt(int(t)) + 1))]
        assert primes == [correct]
    elif row["category"] == "fractions":
        assert max(options.values(), key=Fraction) == correct
        assert len({Fraction(t) for t in options.values()}) == len(options)
    elif found := re.fullmatch(r"What is (\d+) (\+|\N{MULTIPLICATION SIGN}) (\d+)\?", question):
        a, b = int(found[1]), int(found[3])
        assert int(correct) == (a + b if found[2] == "+" else a * b)
    elif found := re.fullmatch(r"What is the square root of (\d+)\?", question):
        assert int(correct) ** 2 == int(found[1])
    elif found := re.fullmatch(r"What is the greatest common divisor of (\d+) and (\d+)\?", question):
        assert int(correct) == math.gcd(int(found[1]), int(found[2]))
    elif found := re.fullmatch(r"What is (\d+)% of (\d+)\?", question):
        assert _value(correct) == Fraction(int(found[1]) * int(found[2]), 100)


def test_datasets_sizes_shapes_and_disjoint_splits():
    assert {split: len(rows) for split, rows in LOADED.items()} == SPLITS
    seen = set()
    for rows in LOADED.values():
        for row in rows:
            options = normalize_options(row["options"])
            assert list(options) in (list("ABCD"), list("ABCDE"))
            assert len(set(options.values())) == len(options)  # distractors differ from the answer
            assert row["expected_answer"] in options
            prompt = row["responses_create_params"]["input"][-1]["content"]
            assert prompt.startswith(row["question"]) and "\\boxed{}" in prompt
            for label, text in options.items():
                assert f"\n{label}) {text}\n" in prompt
            assert row["responses_create_params"].get("tools", []) == []
            assert row["agent_ref"] == {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
            _check_correct_option(row)
            key = (row["question"], frozenset(options.values()))
            assert key not in seen
            seen.add(key)
    assert len({row["category"] for rows in LOADED.values() for row in rows}) == 9
    assert {row["expected_answer"] for row in LOADED["train"]} == set("ABCDE")


def test_generator_reproduces_every_file_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA_DIR, tmp_path)
