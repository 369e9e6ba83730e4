"""code_exec's verify, called in-process through the ASGI app, plus its pure helpers and data."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from polygym import ServerCallError, new_response
from polygym.testing import (
    assert_generator_reproduces,
    in_process_client,
    read_splits,
    serve_in_process,
    synthetic_response,
    verify,
)
from resources_servers.code_exec.app import CodeExec, extract_code, values_equal
from resources_servers.code_exec.problems import PROBLEMS, SPLITS, reference_outputs
from resources_servers.code_exec.sandbox import Sandbox, SandboxConfig

DATA = Path(__file__).resolve().parents[1] / "data"
ROWS = read_splits(DATA)
FAST = {"sandbox": {"limits": {"wall_s": 4, "per_test_timeout_s": 0.5}}}


@pytest.fixture
async def env():
    async with serve_in_process(CodeExec("code_exec", FAST)) as client:
        yield client


def code_answer(code: str) -> dict:
    return synthetic_response(f"Sure:\n\n```python\n{code}\n```\nThis should work.")


async def test_reference_solutions_pass_every_row_of_every_split(env):
    rows = [row for split in ROWS.values() for row in split]
    results = await asyncio.gather(
        *(verify(env, row, new_response(CodeExec.example_solution(row), model="x")) for row in rows)
    )
    for row, result in zip(rows, results, strict=True):
        assert result["reward"] == 1.0, (row["problem_id"], result["error"])
        assert result["num_passed"] == result["num_tests"] == len(row["tests"])
        assert result["status"] == "ok"
        assert result["problem_id"] == row["problem_id"]  # the row is echoed back


async def test_partly_right_code_gets_the_fraction_passed(env):
    row = ROWS["example"][0]  # sum_of_evens
    wrong = "def sum_of_evens(nums):\n    return 0\n"
    result = await verify(env, row, code_answer(wrong))
    expected_zero = sum(1 for t in row["tests"] if t["expected"] == 0)
    assert result["num_passed"] == expected_zero
    assert result["reward"] == pytest.approx(expected_zero / len(row["tests"]))
    assert 0 < result["reward"] < 1
    assert result["error"].endswith("wrong result")
    assert str(row["tests"][0]["expected"]) not in result["error"]  # failures do not leak answers


async def test_all_or_nothing_switch():
    server = CodeExec("code_exec", {**FAST, "all_or_nothing": True})
    client = in_process_client(server)
    row = ROWS["example"][0]
    result = await verify(client, row, code_answer("def sum_of_evens(nums):\n    return 0\n"))
    assert result["reward"] == 0.0 and result["pass_rate"] > 0
    result = await verify(client, row, new_response(CodeExec.example_solution(row), model="x"))
    assert result["reward"] == 1.0


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("", "no_code"),
        ("I don't know.", "load_error"),
        ("```python\n\n```", "no_code"),
        ("```python\ndef other(x):\n    return x\n```", "load_error"),
        ("```python\ndef sum_of_evens(nums) return 0\n```", "load_error"),
        ("```python\nimport os\nos._exit(1)\n```", "crashed"),
        ("```python\nwhile True:\n    pass\n```", "load_error"),
        ("```python\n" + "x = 1\n" * 20_000 + "```", "code_too_long"),
    ],
    ids=["empty", "prose", "empty-block", "wrong-name", "syntax", "exit", "loop-at-import", "too-long"],
)
async def test_failures_score_zero_with_a_status(env, text, status):
    result = await verify(env, ROWS["example"][0], text)
    assert result["reward"] == 0.0
    assert result["status"] == status
    assert result["error"]


async def test_garbage_outputs_score_zero(env):
    row = ROWS["example"][0]
    for response in (
        new_response([], model="x"),
        synthetic_response("x" * 1_000_000),
        new_response([{"type": "function_call", "name": "f", "arguments": "{", "call_id": "c"}], model="x"),
        new_response([{"type": "message", "role": "assistant", "content": [{"type": "refusal"}]}], model="x"),
    ):
        result = await verify(env, row, response)
        assert result["reward"] == 0.0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tests": []}, "tests"),
        ({"tests": "assert f(1) == 2"}, "tests"),
        ({"tests": [{"args": "1", "expected": 2}]}, "tests"),
        ({"entry_point": "os.system"}, "entry_point"),
        ({"entry_point": 5}, "entry_point"),
        ({"response": {"output": "nope"}}, "response"),
    ],
    ids=["no-tests", "tests-string", "args-string", "entry-point-dotted", "entry-point-int", "response"],
)
async def test_malformed_rows_are_422_naming_the_field(env, change, field):
    row = ROWS["example"][0]
    body = {**row, "response": code_answer("def sum_of_evens(nums):\n    return 0\n"), **change}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", body)
    assert err.value.status == 422
    assert field in err.value.detail


async def test_missing_fields_are_422(env):
    row = {k: v for k, v in ROWS["example"][0].items() if k not in ("tests", "entry_point")}
    with pytest.raises(ServerCallError) as err:
        await env.call("env", "/verify", {**row, "response": synthetic_response("x")})
    assert err.value.status == 422
    assert "tests" in err.value.detail and "entry_point" in err.value.detail


async def test_verify_is_deterministic(env):
    row = ROWS["validation"][0]
    response = code_answer("def second_largest(nums):\n    return max(nums) if nums else None\n")
    first, second = await verify(env, row, response), await verify(env, row, response)
    assert first == second
    assert 0 < first["reward"] < 1


async def test_tests_with_kwargs_and_float_tolerance(env):
    row = {
        "responses_create_params": {"input": "divide"},
        "entry_point": "div",
        "tests": [
            {"args": [1], "kwargs": {"b": 3}, "expected": 0.333333333},
            {"args": [2], "kwargs": {"b": 4}, "expected": 0.5},
            {"args": [1], "kwargs": {"b": 1}, "expected": True},
        ],
    }
    result = await verify(env, row, code_answer("def div(a, b):\n    return a / b\n"))
    assert result["num_passed"] == 2  # 1.0 is not True


async def test_health_reports_isolation_and_no_tools(env):
    health = (await env.call("env", "/", method="GET")).json()
    assert health["isolation"] in ("namespaces", "basic")
    assert health["enforcement"] in ("cgroup v1", "cgroup v2", "process_tree")
    assert (await env.call("env", "/tools", method="GET")).json() == []


def test_example_solution_needs_a_reference():
    with pytest.raises(ValueError, match="reference_solution"):
        CodeExec.example_solution({"entry_point": "f"})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\na = 1\n```", "a = 1\n"),
        ("```py\na = 1\n```\nthen\n```python\nb = 2\n```", "b = 2\n"),
        ("```\nc = 3\n```", "c = 3\n"),
        ("```bash\nls\n```", ""),
        ("```python\na = 1\n```\n```text\nout\n```", "a = 1\n"),
        ("def f():\n    return 1", "def f():\n    return 1"),
        ("Here:\n```python\ndef f():\n    return 1", "def f():\n    return 1"),
        ("```Python3 title\nd = 4\n```", "d = 4\n"),
    ],
    ids=[
        "python",
        "last-block",
        "untagged",
        "other-language",
        "skip-non-python",
        "bare",
        "unterminated",
        "tag",
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


@pytest.mark.parametrize(
    ("expected", "actual", "equal"),
    [
        (1, 1, True),
        (1, 1.0, True),
        (0.1 + 0.2, 0.3, True),
        (True, 1, False),
        (1, True, False),
        (None, None, True),
        (None, 0, False),
        ([1, [2]], [1, [2]], True),
        ([1, 2], [1, 2, 3], False),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"b": 1}, False),
        ("1", 1, False),
        (float("nan"), float("nan"), True),
    ],
)
def test_values_equal(expected, actual, equal):
    assert values_equal(expected, actual) is equal


def test_datasets_are_consistent_with_the_problem_bank():
    assert len(ROWS["example"]) == 5
    assert {r["problem_id"] for r in ROWS["train"]} == {p.problem_id for p in SPLITS["train"]}
    assert {r["problem_id"] for r in ROWS["validation"]} == {p.problem_id for p in SPLITS["validation"]}
    assert not {r["problem_id"] for r in ROWS["train"]} & {r["problem_id"] for r in ROWS["validation"]}
    assert 10 <= len(PROBLEMS) <= 30
    for problem in PROBLEMS:
        assert len(problem.inputs) >= 5
        outputs = [json.loads(json.dumps(o)) for o in reference_outputs(problem)]
        assert len({json.dumps(o) for o in outputs}) > 1, problem.problem_id  # tests discriminate
    for row in ROWS["train"] + ROWS["validation"]:
        prompt = row["responses_create_params"]["input"][-1]["content"]
        assert f"`def {row['entry_point']}(" in prompt
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "code_exec_simple_agent"}


def test_generator_reproduces_the_files_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA, tmp_path)


async def test_basic_isolation_still_limits_time_and_output():
    sandbox = Sandbox(SandboxConfig(isolation="basic", limits={"wall_s": 3, "per_test_timeout_s": 0.5}))
    ok = await sandbox.run("def f(x):\n    return x + 1\n", "f", [{"args": [1]}])
    assert ok.isolation == "basic" and ok.outcomes[0].value == 2
    loop = await sandbox.run("def f(x):\n    while True:\n        pass\n", "f", [{"args": [1]}])
    assert "time limit" in loop.outcomes[0].error
    flood = await sandbox.run(
        "import os\n\ndef f(x):\n    for fd in range(3, 64):\n        try:\n            while True:\n"
        "                os.write(fd, b'x' * 65536)\n        except OSError:\n            pass\n",
        "f",
        [{"args": [1]}],
    )
    assert flood.status == "output_limit"
