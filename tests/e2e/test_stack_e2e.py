"""End to end: real servers on 127.0.0.1, the scripted model, both launcher backends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.net.client import ServerClient
from polygym.stack import records as stacks
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from tests.conftest import ROOT, gone, gym_command, wait_until

pytestmark = pytest.mark.e2e

ENVS = ("example_single_tool_call", "example_multi_step")
SELECTORS = ["--model-type", "scripted_model", *[a for e in ENVS for a in ("--resources-server", e)]]


def example_rows(env: str) -> list[dict[str, Any]]:
    path = ROOT / "resources_servers" / env / "data" / "example.jsonl"
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def two_env_config() -> Any:
    return load_config(selector_paths(list(ENVS), ["scripted_model"], []), env_files=[])


@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_every_example_row_is_solved_and_sessions_released(backend: str) -> None:
    stack = Stack(two_env_config(), backend=backend, head_port=0, record=False)
    await stack.start()
    client = ServerClient(stack.head_url)  # a separate client: every call crosses a real socket
    try:
        names = {s["name"] for s in await client.servers()}
        assert names == {"policy_model", *ENVS, *(f"{e}_simple_agent" for e in ENVS)}
        for env in ENVS:
            rows = example_rows(env)
            assert len(rows) == 5
            for row in rows:
                result = (await client.call(f"{env}_simple_agent", "/run", row)).json()
                assert result["reward"] == 1.0, result
                assert result["response"]["output"][-1]["type"] == "message"
                assert result["response"]["usage"]["total_tokens"] > 0
            health = (await client.call(env, "/", method="GET")).json()
            assert health["sessions"] == {"active": 0, "released": 5, "expired": 0}
    finally:
        await client.close()
        await stack.stop()


def test_two_stacks_side_by_side_each_stopped_cleanly_by_sigint(start_stack: Any) -> None:
    """Two inline stacks on one machine serve apart; Ctrl-C stops one (exit 0, its record gone)
    and leaves the other listed."""
    first = start_stack(*SELECTORS)
    second = start_stack(*SELECTORS)
    assert first.record["head_url"] != second.record["head_url"]
    urls = {s["url"] for s in first.record["servers"]} | {s["url"] for s in second.record["servers"]}
    assert len(urls) == 10
    row = example_rows("example_single_tool_call")[0]
    for stack in (first, second):
        reply = _post(stack.server("example_single_tool_call_simple_agent")["url"] + "/run", row)
        assert reply["reward"] == 1.0
    for stack, left in ((first, [second.record["stack_id"]]), (second, [])):
        assert wait_until(lambda s=stack: "ready:" in s.output(), 10)  # printed just after the record
        stack.proc.send_signal(signal.SIGINT)
        assert stack.wait(10) == 0
        assert [record["stack_id"] for record in stacks.list_stacks()] == left


def _post(url: str, payload: Any) -> Any:
    import urllib.request

    request = urllib.request.Request(
        url, data=orjson.dumps(payload), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return orjson.loads(response.read())


def test_killed_server_is_reported_and_the_rest_stopped(start_stack: Any) -> None:
    stack = start_stack(*SELECTORS, "--backend", "subprocess")
    victim = stack.server("example_multi_step")
    others = [pid for pid in stack.child_pids() if pid != victim["pid"]]
    assert len(others) == 4
    os.kill(victim["pid"], signal.SIGKILL)
    assert stack.wait(30) == 1
    output = stack.output()
    assert f"server 'example_multi_step' (pid {victim['pid']}) killed by signal 9" in output
    assert "last lines of" in output
    assert all(gone(pid) for pid in others)
    assert stacks.list_stacks() == []


def test_stop_from_another_terminal(start_stack: Any) -> None:
    stack = start_stack(*SELECTORS, "--backend", "subprocess")
    status = subprocess.run(
        gym_command("env", "status", "--json"), capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    [record] = orjson.loads(status.stdout)
    assert record["stack_id"] == stack.record["stack_id"]
    assert all(h.startswith("ok") for h in record["health"].values()) and len(record["health"]) == 5
    stopped = subprocess.run(gym_command("env", "stop"), capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped stack" in stopped.stdout
    assert stack.wait(10) == 0
    assert wait_until(lambda: all(gone(pid) for pid in stack.child_pids()), 10)
    assert "stopped 5 servers" in stack.output()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "policy_model:\n  responses_api_models:\n    openai_model:\n      openai_base_url: ???\n"
            "      openai_api_key: ${policy_api_key}\n      openai_model: m\n",
            ["openai_base_url: missing required value (from bad.yaml)", "policy_api_key"],
        ),
        (
            "agent:\n  responses_api_agents:\n    simple_agent:\n"
            "      resources_server: {type: resources_servers, name: example_single_tool_cal}\n"
            "      model_server: {type: responses_api_models, name: policy_model}\n",
            [
                "unknown resources_servers server 'example_single_tool_cal'",
                "Did you mean 'example_single_tool_call'",
            ],
        ),
        ("policy_model: [unclosed\n", ["bad.yaml:2", "invalid YAML"]),
    ],
)
def test_config_errors_are_reported_before_anything_starts(
    tmp_path: Path, content: str, expected: list[str]
) -> None:
    (tmp_path / "bad.yaml").write_text(content)
    result = subprocess.run(
        gym_command("env", "start", "--resources-server", "example_single_tool_call", "--config", "bad.yaml"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    for fragment in expected:
        assert fragment in result.stderr, result.stderr
    assert "ready:" not in result.stdout
    assert stacks.list_stacks() == []
