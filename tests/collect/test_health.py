"""Health checks: each finding on a synthetic rollout, rates and quarantine, and the command on a real run."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

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


def test_quarantine_needs_enough_rollouts_and_a_rate_over_the_threshold() -> None:
    monitor = health.HealthMonitor(quarantine_rate=0.5, quarantine_min=4)
    for repeat in range(3):
        monitor.observe(rollout([], repeat=repeat))
    assert monitor.quarantine_reason("env_agent") is None  # 3 < 4 seen
    monitor.observe(rollout([message_item("fine")], repeat=3))
    reason = monitor.quarantine_reason("env_agent")
    assert reason is not None and "unhealthy rate 75%" in reason
    assert monitor.quarantine_reason("other_agent") is None


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
