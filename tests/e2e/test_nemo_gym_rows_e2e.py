"""Same name, same behaviour: NeMo Gym 0.7.0's own example rows through polygym's same-named servers.

For every environment that shares its name with a NeMo Gym resources server, the rows of that
server's ``data/example.jsonl`` are read straight from NeMo Gym's wheel and run with `gym eval run`
on loopback under the scripted model, each row twice: once with a per-row script that plays the
right tool calls and answer, once with one that does not. The rewards asserted are the ones NeMo
Gym's verifiers give (read there, restated here): right play 1.0, wrong play 0.0. `gym data
validate` must accept every row too.

The wheel comes from ``tests/nemo_gym_wheel.py`` (downloaded once with pip, then cached).
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.stack.catalog import list_implementations
from tests.conftest import gym_command
from tests.nemo_gym_wheel import nemo_gym_wheel

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym]

SHARED = (
    "example_multi_step",
    "example_session_state_mgmt",
    "example_single_tool_call",
    "mcqa",
    "reasoning_gym",
)
"""polygym's environments whose name is also a resources server in NeMo Gym 0.7.0."""

RELAXED_SCORE_TIMEOUT = (
    "reasoning_gym:\n  resources_servers:\n    reasoning_gym:\n      score_timeout_s: 180\n"
)

Turns = list[dict[str, Any]]


def nemo_gym_rows(wheel: Path, env: str) -> list[dict[str, Any]]:
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"resources_servers/{env}/data/example.jsonl").decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def weather(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """NeMo Gym rewards any get_weather call; no call gets 0."""
    right: Turns = [
        {"tool": "get_weather", "arguments": {"city": "San Francisco"}},
        {"answer": "It is cold."},
    ]
    return right, [{"answer": "I cannot look that up."}]


def synonyms(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """Look up each expected synonym, submit their values in order; reversed (or off by one) is wrong."""
    values = row["expected_synonym_values"]
    lookups = [{"tool": "get_synonym_value", "arguments": {"synonym": s}} for s in row["expected_synonyms"]]
    wrong = values[::-1] if len(set(values)) > 1 else [v + 1 for v in values]
    submit = "extract_synonym_values"
    return (
        [*lookups, {"tool": submit, "arguments": {"synonym_values": values}}, {"answer": "Done."}],
        [*lookups, {"tool": submit, "arguments": {"synonym_values": wrong}}, {"answer": "Done."}],
    )


def counter(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """Apply the prompt's 'add N' steps with increment_counter; skipping them leaves the wrong count."""
    prompt = row["responses_create_params"]["input"][-1]["content"]
    amounts = [int(n) for n in re.findall(r"add (-?\d+)", prompt)]
    assert row["initial_count"] + sum(amounts) == row["expected_count"], prompt  # NeMo Gym's reward 1
    adds: Turns = [{"tool": "increment_counter", "arguments": {"count": n}} for n in amounts]
    read: Turns = [
        {"tool": "get_counter_value", "arguments": {}},
        {"answer": f"The count is {row['expected_count']}."},
    ]
    return [*adds, *read], read


def choice(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """The expected letter boxed (the rows' strict_single_letter_boxed mode); another letter is wrong."""
    letters = [next(iter(option)) for option in row["options"]]
    other = next(letter for letter in letters if letter != row["expected_answer"])
    say = "Thinking it through, the answer is \\boxed{{{}}}".format
    return [{"answer": say(row["expected_answer"])}], [{"answer": say(other)}]


def reasoning(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """The reference answer in answer tags scores 1 with reasoning-gym's scorer; nonsense scores 0."""
    return [{"answer": f"<answer>{row['answer']}</answer>"}], [{"answer": "<answer>nobody</answer>"}]


POLICIES: dict[str, Callable[[dict[str, Any]], tuple[Turns, Turns]]] = {
    "example_single_tool_call": weather,
    "example_multi_step": synonyms,
    "example_session_state_mgmt": counter,
    "mcqa": choice,
    "reasoning_gym": reasoning,
}


def scripted(env: str, index: int, row: dict[str, Any], kind: str, turns: Turns) -> dict[str, Any]:
    """The row as NeMo Gym ships it, plus its agent and the scripted model's per-request script."""
    params = {**row["responses_create_params"], "metadata": {"script": json.dumps(turns)}}
    return {
        **row,
        "responses_create_params": params,
        "agent_ref": {"type": "responses_api_agents", "name": f"{env}_simple_agent"},
        "nemo_gym_case": f"{env}/{index}/{kind}",
    }


def tool_results(result: dict[str, Any]) -> list[Any]:
    """The parsed tool outputs of a finished rollout, in order."""
    output = result["response"]["output"]
    return [json.loads(item["output"]) for item in output if item.get("type") == "function_call_output"]


def expected_tool_results(env: str, row: dict[str, Any]) -> list[Any]:
    """What NeMo Gym's tools answer to the right play (its rows' values were made by those tools)."""
    if env == "example_single_tool_call":
        return [{"city": "San Francisco", "weather_description": "The weather in San Francisco is cold."}]
    if env == "example_multi_step":
        return [{"synonym_value": v} for v in row["expected_synonym_values"]] + [{"success": True}]
    if env == "example_session_state_mgmt":
        adds = len(re.findall(r"add -?\d+", row["responses_create_params"]["input"][-1]["content"]))
        return [{"success": True}] * adds + [{"count": row["expected_count"]}]
    return []


def collect_cases(cwd: Path, *args: str) -> dict[str, dict[str, Any]]:
    """`gym eval run ARGS` (``--output`` among them) in ``cwd``, which must succeed with no failed
    rollout; its rollouts by case."""
    run = subprocess.run(
        gym_command("eval", "run", *args), cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    files = RunFiles(cwd / args[args.index("--output") + 1])
    assert list(iter_jsonl(files.failures)) == []
    return {row["nemo_gym_case"]: row for row in iter_jsonl(files.output)}


@pytest.fixture(scope="module")
def wheel() -> Path:
    return nemo_gym_wheel()


def test_the_shared_names_are_these(wheel: Path) -> None:
    """A new polygym environment named like a NeMo Gym server must join SHARED (and match it)."""
    with zipfile.ZipFile(wheel) as archive:
        nemo = {name.split("/")[1] for name in archive.namelist() if name.startswith("resources_servers/")}
    assert set(list_implementations("resources_servers")) & nemo == set(SHARED)


@pytest.mark.parametrize("env", SHARED)
def test_gym_data_validate_accepts_every_row(wheel: Path, env: str, tmp_path: Path) -> None:
    rows = tmp_path / "example.jsonl"
    write_jsonl(nemo_gym_rows(wheel, env), rows)
    done = subprocess.run(
        gym_command("data", "validate", "--env", env, "--json", str(rows)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["rows"], report["problems"]) == (5, [])
    assert [(e["env"], e["rows"]) for e in report["environments"]] == [(env, 5)]


def test_every_row_gets_nemo_gyms_reward(wheel: Path, tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = []
    for env in SHARED:
        for index, row in enumerate(nemo_gym_rows(wheel, env)):
            right, wrong = POLICIES[env](row)
            rows += [scripted(env, index, row, "right", right), scripted(env, index, row, "wrong", wrong)]
    write_jsonl(rows, tmp_path / "in.jsonl")
    # A worker's first reasoning-gym import counts against the score time limit; on a busy machine
    # with five servers starting, 20 s is not always enough, and a timeout would read as a 0.
    (tmp_path / "slow.yaml").write_text(RELAXED_SCORE_TIMEOUT)
    selectors = [flag for env in SHARED for flag in ("--resources-server", env)]
    results = collect_cases(
        tmp_path,
        *("--model-type", "scripted_model", *selectors, "--config", "slow.yaml"),
        *("--input", "in.jsonl", "--output", "out.jsonl"),
    )
    rewards = {case: row["reward"] for case, row in results.items()}
    expected = {row["nemo_gym_case"]: 1.0 if row["nemo_gym_case"].endswith("right") else 0.0 for row in rows}
    mismatches = {
        case: results.get(case, {}).get("score_error")
        for case in expected
        if rewards.get(case) != expected[case]
    }
    assert rewards == expected, mismatches
    for env in SHARED:
        for index, row in enumerate(nemo_gym_rows(wheel, env)):
            assert tool_results(results[f"{env}/{index}/right"]) == expected_tool_results(env, row)
    # A 0 must be the verifier's verdict, not a scorer that gave up.
    assert {
        row.get("score_status") for case, row in results.items() if case.startswith("reasoning_gym/")
    } == {"ok"}
    assert len(rewards) == 2 * 5 * len(SHARED)  # every shipped row, accepted and scored


def test_the_readmes_two_environment_flow_with_nemo_gyms_data_files(
    wheel: Path, tmp_path: Path, start_stack: Any
) -> None:
    """The README's flow (`gym env start` both examples, rows stamped with their agent as its jq
    lines do, `gym eval run --no-serve`) fed with NeMo Gym's own example.jsonl files: 10 rollouts,
    none failed, each with the tool results and reward NeMo Gym's servers give the right play."""
    flow = ("example_single_tool_call", "example_multi_step")
    start_stack(
        "--model-type", "scripted_model", *(flag for env in flow for flag in ("--resources-server", env))
    )
    rows = [
        scripted(env, index, row, "right", POLICIES[env](row)[0])
        for env in flow
        for index, row in enumerate(nemo_gym_rows(wheel, env))
    ]
    write_jsonl(rows, tmp_path / "results" / "test_multiverifier_input.jsonl")
    results = collect_cases(
        tmp_path,
        *("--no-serve", "--input", "results/test_multiverifier_input.jsonl"),
        *("--output", "results/test_multiverifier_outputs.jsonl"),
    )
    assert len(results) == 10
    assert {case: row["reward"] for case, row in results.items()} == {
        row["nemo_gym_case"]: 1.0 for row in rows
    }
    for row in rows:
        case = row["nemo_gym_case"]
        assert tool_results(results[case]) == expected_tool_results(case.split("/")[0], row), case
