"""Health checks: each finding on a synthetic rollout, rates and quarantine, and the command on a real run."""

from __future__ import annotations

import gc
import json
import subprocess
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.collect import health
from polygym.jsonl import write_jsonl
from polygym.protocol import function_call_item, function_call_output_item, message_item, new_response
from tests.conftest import ROOT, gym_command

AGENT = {"type": "responses_api_agents", "name": "env_agent"}
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    }
]


def rollout(
    output: list[dict[str, Any]], task: int = 0, repeat: int = 0, reward: float = 1.0, **response: Any
):
    return {
        "responses_create_params": {"input": "hi", "tools": TOOLS},
        "agent_ref": AGENT,
        "response": {
            **new_response(output, "m", {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}),
            **response,
        },
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
    }


def kinds(row: dict[str, Any]) -> list[str]:
    return [kind for kind, _ in health.rollout_findings(row)]


def test_a_plain_good_rollout_has_no_findings() -> None:
    call = function_call_item("lookup", {"q": "x"}, "c1")
    assert kinds(rollout([call, function_call_output_item("c1", "ok"), message_item("done")])) == []


def test_each_rollout_finding() -> None:
    assert kinds(rollout([])) == [health.MODEL_NOT_CALLED]
    assert kinds(rollout([function_call_output_item("c1", "tool only")])) == [health.MODEL_NOT_CALLED]
    reasoning_only = {"type": "reasoning", "id": "r1", "summary": []}
    assert kinds(rollout([reasoning_only, message_item("   ")])) == [health.HOLLOW_TURN]
    zero = rollout([message_item("x")], usage={"input_tokens": 3, "output_tokens": 0, "total_tokens": 3})
    assert kinds(zero) == [health.ZERO_TOKENS]
    cut = rollout(
        [message_item("x")], status="incomplete", incomplete_details={"reason": "max_output_tokens"}
    )
    assert kinds(cut) == [health.RUNAWAY]
    bad = rollout([function_call_item("lookup", {"q": 5}, "c1"), message_item("x")])
    assert kinds(bad) == [health.BAD_TOOL_ARGUMENTS]
    unknown_tool = rollout([function_call_item("other", {"q": 5}, "c1"), message_item("x")])
    assert kinds(unknown_tool) == []  # offered tools only: an unknown name is the agent's to report


def test_duplicates_and_task_findings_need_the_whole_run() -> None:
    rows = [
        rollout([message_item("a")], task=0, repeat=0, reward=0.0),
        rollout([message_item("a")], task=0, repeat=1, reward=0.0),
        rollout([message_item("a")], task=1, repeat=0),
        rollout([message_item("a")], task=1, repeat=0),
    ]
    failures = [{"agent_ref": AGENT, "_ng_task_index": 2, "_ng_rollout_index": r} for r in (0, 1)]
    monitor = health.check_run(rows, failures)
    found = {(f.kind, f.task_index) for f in monitor.findings}
    assert found == {(health.DUPLICATE, 1), (health.NEVER_SOLVED, 0), (health.ALWAYS_FAILED, 2)}
    summary = monitor.summary()["env_agent"]
    assert (summary["rollouts"], summary["failures"], summary["unhealthy"]) == (4, 2, 1)
    assert summary["failure_rate"] == 2 / 6


def test_duplicates_are_found_whatever_the_repeat_index() -> None:
    """Dense indices are kept as bits, any other (negative, huge, absent, text) in a set: both find
    a repeat written twice, and the same index in another task is no duplicate."""
    repeats = [0, 7, 8, 100_000, -1, 2**40, None, "r1"]
    rows = [rollout([message_item("a")], task=3, repeat=r) for r in repeats * 2]
    rows += [rollout([message_item("a")], task=4, repeat=r) for r in repeats]
    monitor = health.check_run(rows, [])
    duplicates = [(f.task_index, f.rollout_index) for f in monitor.findings if f.kind == health.DUPLICATE]
    assert duplicates == [(3, r) for r in repeats]


def test_a_monitor_keeps_no_record_per_rollout() -> None:
    """A run's monitor sees every rollout: it keeps counts and a bit per repeat index, not an entry
    per rollout (a set of keys and per-task lists kept ~150 bytes each: 4 MiB a minute at 400/s)."""
    monitor = health.HealthMonitor(keep_findings=False)
    good = rollout([message_item("done")])

    def watch(first: int, count: int) -> None:
        for i in range(first, first + count):
            monitor.observe({**good, "_ng_task_index": i % 4, "_ng_rollout_index": i // 4})
            if i % 10 == 0:
                monitor.observe_failure({"agent_ref": AGENT, "_ng_task_index": i % 4})

    watch(0, 1_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        watch(1_000, 20_000)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert monitor.envs["env_agent"].rollouts == 21_000 and monitor.envs["env_agent"].failures == 2_100
    assert kept < 20_000  # under a byte per rollout; a record each was ~3 MB here


def test_a_live_monitor_counts_findings_without_listing_them() -> None:
    monitor = health.HealthMonitor(keep_findings=False)
    found = monitor.observe(rollout([]))
    assert [f.kind for f in found] == [health.MODEL_NOT_CALLED]
    assert monitor.findings == []
    assert monitor.envs["env_agent"].kinds == {health.MODEL_NOT_CALLED: 1}
    assert monitor.metrics("env_agent")["health/unhealthy_rollouts"] == 1


def test_quarantine_needs_enough_rollouts_and_a_rate_over_the_threshold() -> None:
    monitor = health.HealthMonitor(quarantine_rate=0.5, quarantine_min=4)
    for repeat in range(3):
        monitor.observe(rollout([], repeat=repeat))
    assert monitor.quarantine_reason("env_agent") is None  # 3 < 4 seen
    monitor.observe(rollout([message_item("fine")], repeat=3))
    reason = monitor.quarantine_reason("env_agent")
    assert reason is not None and "unhealthy rate 75%" in reason
    assert monitor.quarantine_reason("other_agent") is None


@pytest.mark.e2e
def test_health_check_command_on_a_real_run(tmp_path: Path) -> None:
    """A scripted run where the model sends a hollow answer and a tool call its schema rejects."""
    source = ROOT / "resources_servers/example_multi_step/data/example.jsonl"
    rows = [json.loads(line) for line in source.read_text().splitlines()][:2]
    script = [{"tool": "get_synonym_value", "arguments": {"synonym": 7}}, {"answer": ""}]
    rows[0]["responses_create_params"]["metadata"] = {"script": json.dumps(script)}
    write_jsonl(rows, tmp_path / "in.jsonl")
    run = subprocess.run(
        gym_command(
            "eval",
            "run",
            "--model-type",
            "scripted_model",
            "--resources-server",
            "example_multi_step",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    checked = subprocess.run(
        gym_command("eval", "health-check", "out.jsonl", "--json", "--fail-on-findings"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1, checked.stderr
    report = orjson.loads(checked.stdout)
    by_task = {(f["kind"], f["_ng_task_index"]) for f in report["findings"]}
    assert by_task == {(health.HOLLOW_TURN, 0), (health.BAD_TOOL_ARGUMENTS, 0)}
    env = report["environments"]["example_multi_step_simple_agent"]
    assert (env["rollouts"], env["unhealthy"]) == (2, 1)
    table = subprocess.run(
        gym_command("eval", "health-check", "out.jsonl"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0 and "tool_arguments_rejected" in table.stdout
    missing = subprocess.run(
        gym_command("eval", "health-check", "nope.jsonl"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_an_unhealthy_environment_is_quarantined_and_the_others_finish(tmp_path: Path) -> None:
    """Every weather rollout is hollow (an empty answer): after 4 of them the environment stops,
    its remaining rollouts are recorded as Quarantined, the synonym rollouts all finish, exit 1."""
    hollow = json.dumps([{"answer": ""}])
    weather = [
        json.loads(line)
        for line in (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl")
        .read_text()
        .splitlines()
    ]
    for row in weather:
        row["responses_create_params"]["metadata"] = {"script": hollow}
    synonyms = [
        json.loads(line)
        for line in (ROOT / "resources_servers/example_multi_step/data/example.jsonl")
        .read_text()
        .splitlines()
    ]
    write_jsonl(weather + synonyms, tmp_path / "in.jsonl")
    run = subprocess.run(
        gym_command(
            "eval",
            "run",
            "--model-type",
            "scripted_model",
            "--resources-server",
            "example_single_tool_call",
            "--resources-server",
            "example_multi_step",
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--num-repeats",
            "4",
            "--concurrency",
            "2",
            "--quarantine-min",
            "4",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 1, run.stderr
    assert (
        "environment 'example_single_tool_call_simple_agent' was quarantined: unhealthy rate 100%"
        in run.stderr
    )
    failures = [json.loads(line) for line in (tmp_path / "out_failures.jsonl").read_text().splitlines()]
    assert failures and {f["error_class"] for f in failures} == {health.QUARANTINED}
    assert {f["agent_ref"]["name"] for f in failures} == {"example_single_tool_call_simple_agent"}
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    done = Counter(r["agent_ref"]["name"] for r in rows)
    assert done["example_multi_step_simple_agent"] == 20
    assert 4 <= done["example_single_tool_call_simple_agent"] < 20
    metrics = {
        m["agent_ref"]["name"]: m["agent_metrics"]
        for m in orjson.loads((tmp_path / "out_aggregate_metrics.json").read_bytes())
    }
    weather_metrics = metrics["example_single_tool_call_simple_agent"]
    assert weather_metrics["health/hollow_turn"] == done["example_single_tool_call_simple_agent"]
    assert metrics["example_multi_step_simple_agent"]["health/unhealthy_rollouts"] == 0
