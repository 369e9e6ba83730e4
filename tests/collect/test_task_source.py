"""Rows routed by ``task_source`` (NeMo Gym's newer datasets) instead of ``agent_ref``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from polygym.cli import gym
from polygym.collect.task_source import task_routes
from polygym.jsonl import iter_jsonl
from polygym.stack.catalog import project_root


def agent(resources: str, **extra: Any) -> dict[str, Any]:
    ref = {"type": "resources_servers", "name": resources}
    return {"responses_api_agents": {"simple_agent": {"resources_server": ref, **extra}}}


def resources(*pins: str) -> dict[str, Any]:
    datasets = [{"name": f"d{i}", "agent": pin} for i, pin in enumerate(pins)]
    return {"resources_servers": {"env": {"datasets": datasets} if datasets else {}}}


def test_an_agent_runs_its_own_rows_and_a_resources_server_its_one_agents() -> None:
    routes = task_routes({"weather": resources(), "weather_agent": agent("weather"), "n": 3})
    assert routes.agent_for("weather") == "weather_agent"
    assert routes.agent_for("weather_agent") == "weather_agent"
    assert routes.agent_for("n") is None and "not a server instance" in routes.why_not("n")


def test_a_dataset_pin_chooses_among_agents_and_ambiguity_is_refused() -> None:
    two = {"a1": agent("env"), "a2": agent("env")}
    assert task_routes({"env": resources("a2"), **two}).agent_for("env") == "a2"
    refused = task_routes({"env": resources(), **two})
    assert refused.agent_for("env") is None and "2 agents reference it (a1, a2)" in refused.why_not("env")
    assert "pin several agents" in task_routes({"env": resources("a1", "a2"), **two}).why_not("env")
    assert "does not reference it" in task_routes({"env": resources("x"), **two}).why_not("env")
    assert "no agent references it" in task_routes({"env": resources()}).why_not("env")


STACK = (
    "--model-type",
    "scripted_model",
    "--resources-server",
    "example_single_tool_call",
    "--resources-server",
    "example_multi_step",
)


def rows_with_task_source(tmp_path: Path, task_source: str) -> Path:
    example = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"
    rows = []
    for line in example.read_text().splitlines()[:2]:
        row = orjson.loads(line)
        row.pop("agent_ref", None)
        rows.append(orjson.dumps({**row, "task_source": task_source}).decode())
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.e2e
def test_gym_eval_run_routes_task_source_rows_to_the_agent_of_that_server(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rows = rows_with_task_source(tmp_path, "example_single_tool_call")
    result = CliRunner().invoke(
        gym, ["eval", "run", *STACK, "-i", str(rows), "-o", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    done = list(iter_jsonl(out))
    assert len(done) == 2
    assert {row["agent_ref"]["name"] for row in done} == {"example_single_tool_call_simple_agent"}
    assert {row["task_source"] for row in done} == {"example_single_tool_call"}


def test_gym_eval_run_refuses_a_task_source_it_cannot_route(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rows = rows_with_task_source(tmp_path, "no_such_instance")
    result = CliRunner().invoke(
        gym, ["eval", "run", *STACK, "-i", str(rows), "-o", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert "task_source 'no_such_instance': cannot route: not a server instance" in result.output
    assert not out.exists()


def test_gym_data_validate_routes_task_source_rows(tmp_path: Path) -> None:
    from polygym.blend.validate import validate_files

    assert validate_files([rows_with_task_source(tmp_path, "example_single_tool_call")]).problems == []
    problems = validate_files([rows_with_task_source(tmp_path, "nope")]).problems
    assert problems and all("task_source 'nope': cannot route" in problem for problem in problems)
