"""Every shipped environment in one stack: a mixed dataset through `gym eval run`.

The scripted model solves only the two example environments; for the others it plays its generic
policy, so the point here is that every environment, agent and verifier works together in one
run with no failures — not the rewards.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl
from polygym.stack.catalog import list_implementations
from tests.conftest import gym_command

pytestmark = pytest.mark.e2e


def test_every_environment_in_one_run(tmp_path: Path) -> None:
    envs = list_implementations("resources_servers")
    assert len(envs) >= 8
    env_flags = [flag for env in envs for flag in ("--env", env)]
    blend = subprocess.run(
        gym_command("data", "blend", *env_flags, "--order", "concat", "--output", "mixed.jsonl"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert blend.returncode == 0, blend.stderr
    selectors = [flag for env in envs for flag in ("--resources-server", env)]
    run = subprocess.run(
        gym_command(
            "eval",
            "run",
            "--model-type",
            "scripted_model",
            *selectors,
            "--input",
            "mixed.jsonl",
            "--output",
            "out.jsonl",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    files = RunFiles(tmp_path / "out.jsonl")
    assert list(iter_jsonl(files.failures)) == []
    rows = list(iter_jsonl(files.output))
    agents = {row["agent_ref"]["name"] for row in rows}
    assert len(agents) == len(envs)
    assert all(isinstance(row["reward"], float) for row in rows)
    by_agent = {entry["agent_ref"]["name"]: entry for entry in orjson.loads(files.metrics.read_bytes())}
    assert by_agent["example_single_tool_call_simple_agent"]["agent_metrics"]["mean/reward"] == 1.0
    assert by_agent["example_multi_step_simple_agent"]["agent_metrics"]["mean/reward"] == 1.0
