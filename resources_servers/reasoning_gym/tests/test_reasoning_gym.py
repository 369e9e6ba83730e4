"""reasoning_gym: verify with the package's own scorers (in worker processes), extraction, data."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from polygym import ServerCallError, function_call_item, new_response
from polygym.testing import (
    ServerClient,
    assert_generator_reproduces,
    in_process_client,
    read_splits,
    synthetic_response,
    verify,
)
from resources_servers.reasoning_gym.app import ReasoningGym, extract_answer
from resources_servers.reasoning_gym.data.generate import DEFAULT_TASKS

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = read_splits(DATA)
GENERATED_WITH = "0.1.25"  # the reasoning-gym version the shipped files were generated with


# Tests that use the module's served server run in the module's event loop (its pool's loop).
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[ReasoningGym]:
    """One served server (so one worker pool) for the module: workers import reasoning-gym once (~1 s)."""
    env = ReasoningGym("reasoning_gym", {"cpu_workers": 1})
    async with env.app.router.lifespan_context(env.app):
        yield env


@pytest.fixture
def env(server: ReasoningGym) -> ServerClient:
    return in_process_client(server)


def one_row_per_task() -> list[dict]:
    seen: dict[str, dict] = {}
    for row in ROWS["validation"]:
        seen.setdefault(row["task"], row)
    return list(seen.values())


@pytest.mark.slow
@module_loop
@pytest.mark.parametrize("row", one_row_per_task(), ids=lambda r: r["task"])
async def test_reference_answer_scores_one_and_a_wrong_one_less(env, row):
    good = await verify(env, row, new_response(ReasoningGym.example_solution(row), model="x"))
    assert good["reward"] == 1.0
    assert good["score_status"] == "ok"
    assert good["extracted_answer"] == row["entry"]["answer"]
    assert good["task"] == row["task"]  # the row is echoed back
    bad = await verify(env, row, "<answer>definitely not it 0000</answer>")
    assert bad["reward"] < 1.0 and bad["score_status"] == "ok"


@module_loop
async def test_the_package_scorer_decides_including_partial_credit(env):
    row = next(r for r in ROWS["train"] if r["task"] == "basic_arithmetic")
    expected = row["entry"]["answer"]
    result = await verify(env, row, f"<answer>The answer is {expected}</answer>")
    # reasoning-gym's default scorer: partial credit len(oracle)/len(answer) when it contains it.
    assert result["reward"] == pytest.approx(len(expected) / len(f"The answer is {expected}"))


@module_loop
async def test_scorer_exceptions_are_reward_zero(env):
    row = {
        "responses_create_params": {"input": "factor 12"},
        "task": "prime_factorization",
        "task_config": {"size": 1, "seed": 1},
        "entry": {"question": "Factor 12", "answer": "2 \u00d7 2 \u00d7 3", "metadata": {}},
    }
    result = await verify(env, row, "<answer>not numbers</answer>")
    assert result["reward"] == 0.0
    assert result["score_status"] == "score_error" and "ValueError" in result["score_error"]


@module_loop
@pytest.mark.parametrize(
    ("response", "status"),
    [
        (new_response([], model="x"), "no_answer"),
        (synthetic_response("42"), "no_answer"),
        (synthetic_response("<answer>" + "7" * 1_000_000 + "</answer>"), "answer_too_long"),
        (synthetic_response("x" * 1_000_000), "no_answer"),
        (new_response([function_call_item("f", "{")], model="x"), "no_answer"),
    ],
    ids=["empty", "untagged", "huge-answer", "1MB-text", "only-a-call"],
)
async def test_garbage_scores_zero(env, response, status):
    result = await verify(env, ROWS["example"][0], response)
    assert result["reward"] == 0.0
    assert result["score_status"] == status


@module_loop
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"task": "no_such_task"}, "task"),
        ({"task_config": {"size": 1, "seed": 1, "no_such_option": 3}}, "task_config"),
        ({"task_config": {"min_terms": 5, "max_terms": 2}}, "max_terms must be >= min_terms"),
        ({"entry": {"answer": "1"}}, "entry.question"),
        ({"entry": "2"}, "entry"),
        ({"task": 5}, "task"),
    ],
    ids=["unknown-task", "unknown-option", "invalid-option", "no-question", "entry-string", "task-int"],
)
async def test_malformed_rows_are_422(env, change, field):
    row = {**ROWS["example"][0], **change}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", {**row, "response": synthetic_response("<answer>1</answer>")})
    assert err.value.status == 422
    assert field in err.value.detail


def test_a_missing_dependency_is_a_broken_install_not_an_unknown_task(monkeypatch):
    """Seen on a machine without pytz: every arithmetic row was a 422 blaming its task_config."""
    from resources_servers.reasoning_gym import scoring

    def missing(task: str, config_json: str) -> None:
        raise ModuleNotFoundError("No module named 'pytz'")

    monkeypatch.setattr(scoring, "_dataset", missing)
    row = ROWS["example"][0]
    status, message = scoring.score(row["task"], json.dumps(row["task_config"]), row["entry"], "1")
    assert status == "broken_install"
    assert "pytz" in message and row["task"] in message


@module_loop
async def test_a_broken_install_is_a_final_500_naming_the_extra(server, monkeypatch):
    async def broken(*args: object, **kwargs: object) -> tuple[str, str]:
        return "broken_install", "task basic_arithmetic cannot be built: No module named 'pytz'"

    monkeypatch.setattr(server.cpu_pool, "run", broken)
    row = ROWS["example"][0]
    with pytest.raises(ServerCallError) as err:
        await in_process_client(server).call(
            "env", "/verify", {**row, "response": synthetic_response("<answer>1</answer>")}
        )
    assert err.value.status == 500
    assert "pytz" in err.value.detail and "[envs]" in err.value.detail


@module_loop
async def test_answer_formats(server):
    row = ROWS["example"][0]
    expected = row["entry"]["answer"]
    for answer_format, text, reward in [
        ("tag", f"Working...\n{expected}", 0.0),
        ("last_line", f"Working...\n{expected}\n", 1.0),
        ("tag_or_last_line", f"<answer>{expected}</answer>\nbye", 1.0),
        ("tag_or_last_line", f"so\n{expected}", 1.0),
    ]:
        server.config.answer_format = answer_format
        try:
            assert (await verify(in_process_client(server), row, text))["reward"] == reward, answer_format
        finally:
            server.config.answer_format = "tag"


@module_loop
async def test_verify_is_deterministic(env):
    row = ROWS["example"][1]
    body = {**row, "response": synthetic_response("<answer>3</answer>")}
    first, second = [(await env.call("env", "/verify", body)).json() for _ in range(2)]
    assert first == second


@module_loop
async def test_aggregate_metrics_break_reward_down_by_task(env):
    rollouts = [
        {"task": "gcd", "reward": 1.0, "_ng_task_index": 0},
        {"task": "lcm", "reward": 0.0, "_ng_task_index": 1},
    ]
    result = (await env.call("env", "/aggregate_metrics", {"rollouts": rollouts})).json()
    assert result["agent_metrics"]["mean/reward/gcd"] == 1.0
    assert result["agent_metrics"]["mean/reward/lcm"] == 0.0


@pytest.mark.parametrize(
    ("text", "mode", "expected"),
    [
        ("<answer> 42 </answer>", "tag", "42"),
        ("<answer>1</answer> then <ANSWER>2</ANSWER>", "tag", "2"),
        ("<answer>a\nb</answer>", "tag", "a\nb"),
        ("no tags", "tag", None),
        ("", "last_line", None),
        ("line one\n  line two  \n\n", "last_line", "line two"),
        ("x\n<answer>y</answer>", "last_line", "<answer>y</answer>"),
        ("just this", "tag_or_last_line", "just this"),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_example_solution_needs_an_answer():
    with pytest.raises(ValueError, match="reference answer"):
        ReasoningGym.example_solution({"entry": {"question": "q", "answer": None}})


def test_datasets():
    assert len(ROWS["example"]) == 5
    assert {r["task"] for r in ROWS["train"]} == set(DEFAULT_TASKS)
    assert len(ROWS["train"]) == 50 * len(DEFAULT_TASKS)
    train_questions = {r["entry"]["question"] for r in ROWS["train"]}
    assert not train_questions & {r["entry"]["question"] for r in ROWS["validation"]}
    for row in ROWS["example"] + ROWS["validation"]:
        assert row["responses_create_params"]["input"][-1]["content"] == row["entry"]["question"]
        assert row["entry"]["metadata"]["source_dataset"] == row["task"]
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}


@pytest.mark.slow
def test_generator_reproduces_the_files_byte_for_byte(tmp_path):
    assert importlib.metadata.version("reasoning-gym") == GENERATED_WITH  # pinned in pyproject.toml
    assert_generator_reproduces(DATA, tmp_path)


NEMO_GYM_ROW = {  # the shape of NeMo Gym's reasoning_gym rows: entry fields at the top level
    "responses_create_params": {"input": [{"role": "user", "content": "Calculate 2 + 3."}]},
    "question": "Calculate 2 + 3.",
    "answer": "5",
    "metadata": {"source_dataset": "basic_arithmetic", "source_index": 0},
}


@module_loop
@pytest.mark.parametrize(
    ("text", "reward", "extracted"),
    [
        ("Sum: <answer> 5 </answer>", 1.0, "5"),
        ("So \\boxed{5}, I think", 1.0, "5"),  # NeMo Gym falls back to \boxed{}
        ("5", 1.0, "5"),  # ... and then to the whole text
        ("<answer>6</answer>", 0.0, "6"),
    ],
    ids=["tag", "boxed", "whole-text", "wrong"],
)
async def test_nemo_gym_row_is_scored_as_nemo_gym_scores_it(env, text, reward, extracted):
    result = await verify(env, NEMO_GYM_ROW, synthetic_response(text))
    assert (result["reward"], result["extracted_answer"], result["task"]) == (
        reward,
        extracted,
        "basic_arithmetic",
    )


@module_loop
async def test_nemo_gym_row_without_source_dataset_is_422(env):
    row = {**NEMO_GYM_ROW, "metadata": {"source_index": 0}}
    with pytest.raises(ServerCallError) as err:
        await verify(env, row, synthetic_response("<answer>5</answer>"))
    assert err.value.status == 422
    assert "source_dataset" in err.value.detail


def nemo_gym_stored_rollouts() -> list[dict]:
    """NeMo Gym 0.7.0's own stored rollouts of its reasoning_gym (``response.status`` is null)."""
    from tests.nemo_gym_wheel import nemo_gym_tree

    path = nemo_gym_tree() / "resources_servers" / "reasoning_gym" / "data" / "example_rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.nemo_gym
@module_loop
async def test_nemo_gym_stored_responses_are_accepted_and_read_as_nemo_gym_reads_them(env):
    """Every stored response verifies (no 422 on ``status: null``) and polygym extracts the answer
    NeMo Gym recorded from it (stripped: 0.7.0's verifier strips it, the recording kept the blank
    lines before it). The rollouts keep no question or reference answer, so the row is rebuilt
    from the prompt and the recorded task, with the recorded extraction as the reference."""
    stored = nemo_gym_stored_rollouts()
    assert stored and all(rollout["response"].get("status") is None for rollout in stored)
    for rollout in stored:
        question = rollout["responses_create_params"]["input"][-1]["content"]
        row = {
            "responses_create_params": rollout["responses_create_params"],
            "question": question,
            "answer": rollout["extracted_answer"],
            "metadata": {"source_dataset": rollout["task_name"]},
        }
        result = await verify(env, row, rollout["response"])
        assert result["extracted_answer"] == rollout["extracted_answer"].strip()
        assert (result["task"], result["reward"]) == (rollout["task_name"], 1.0)
