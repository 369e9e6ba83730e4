"""NeMo Gym 0.7.0's ``single_agent_turn`` environment server in a polygym stack, fed materialized tasks.

One ``gym env start`` runs NeMo Gym's own ``environment_servers/single_agent_turn`` (its shipped
config, ``config_paths``), NeMo Gym's ``example_single_tool_call`` resources server and
``simple_agent`` (from the unpacked wheel, in the cached nemo-gym environment), and polygym's
scripted model. ``gym eval run --no-serve`` then sends rows ``{task_id: {taskset, task_id},
task_input}`` through ``environment_server_routes`` as NeMo Gym's episode requests: the verdicts of
NeMo Gym's verifier (1.0 when the model called ``get_weather``) come back stamped as NeMo Gym's
collector stamps them, and an episode the server answers with a typed failure (the model fails,
so the agent does) lands in the failures file with its stage, never as a reward.

``single_agent_turn`` declares no ``ray_enabled``, so NeMo Gym's server joins a Ray cluster as it
starts: the stack starts one for both of them, as NeMo Gym's ``ng_run`` does, and ends it with
itself; neither server starts a cluster of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR, selector_paths
from polygym.stack.config import load_config
from polygym.stack.env_build import CACHE_ENV_VAR, PYTHON_ENV_VAR, ensure_env
from polygym.stack.nemo_gym_server import env_inputs, is_nemo_gym_server
from tests.conftest import gone, gym_command, listening_hosts, wait_until
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, env_cache, nemo_gym_tree
from tests.stack.test_nemo_gym_ray import loopback

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym, pytest.mark.ray]

BUILD_TIMEOUT_S = 1800
"""A machine without the cached nemo-gym environment builds it first (pip, ~300 packages)."""
STACK = """\
config_paths:
  - environment_servers/single_agent_turn/configs/single_agent_turn.yaml
weather:
  resources_servers:
    example_single_tool_call:
      nemo_gym: true
      domain: agent
weather_agent:
  responses_api_agents:
    simple_agent:
      nemo_gym: true
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
single_agent_turn:
  environment_servers:
    single_agent_turn:
      resources_server: {type: resources_servers, name: weather}
      agent_server: {type: responses_api_agents, name: weather_agent}
      resources_tool_transports: [direct_http]
polygym_weather:
  resources_servers:
    example_single_tool_call:
      domain: agent
polygym_episodes:
  environment_servers:
    single_agent_turn:
      resources_server: {type: resources_servers, name: polygym_weather}
      agent_server: {type: responses_api_agents, name: weather_agent}
      resources_tool_transports: [direct_http]
      cleanup_timeout_seconds: 60
environment_server_routes:
  weather: single_agent_turn
  polygym_weather: polygym_episodes
"""
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": False,
    }
]
PLAYS = {
    "right": [{"tool": "get_weather", "arguments": {"city": "SF"}}, {"answer": "Cold."}],
    "wrong": [{"answer": "No idea."}],
    "broken": [{"error": 400, "message": "scripted failure"}],
}


def task(case: str, taskset: str = "weather") -> dict[str, Any]:
    """A materialized task; polygym's environment also checks the city (``expected_city``)."""
    params = {
        "input": [{"role": "user", "content": "what's it like in sf?"}],
        "tools": TOOLS,
        "metadata": {"script": json.dumps(PLAYS[case])},
    }
    return {
        "task_id": {"taskset": taskset, "task_id": case},
        "task_input": {"responses_create_params": params, "task_data": {"expected_city": "SF"}},
    }


@pytest.fixture
def nemo_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stack's config in ``tmp_path``, NeMo Gym 0.7.0's tree and cached environments named for
    the ``gym`` children, its environment built now if the cache lacks it."""
    if not NEMO_GYM_PYTHON.is_file():
        pytest.fail(f"this test needs Python 3.13.0 at {NEMO_GYM_PYTHON} (pyenv install 3.13.0)")
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(nemo_gym_tree()))
    monkeypatch.setenv(CACHE_ENV_VAR, str(env_cache()))
    monkeypatch.setenv(PYTHON_ENV_VAR, str(NEMO_GYM_PYTHON))
    config = tmp_path / "stack.yaml"
    config.write_text(STACK)
    loaded = load_config(selector_paths([], ["scripted_model"], [str(config)]))
    for spec in loaded.servers.values():
        if is_nemo_gym_server(spec):
            ensure_env(env_inputs(spec, loaded))
    return config


def ray_cluster(stack: Any) -> tuple[str, psutil.Process]:
    """The address ``gym env start`` says its Ray cluster has, and the process that owns it."""
    said = re.compile(
        r"Ray cluster (127\.0\.0\.1:\d+) started for NeMo Gym's single_agent_turn, polygym_episodes "
    )
    assert wait_until(lambda: said.search(stack.output()), 30), stack.output()
    match = said.search(stack.output())
    assert match is not None
    owners = [
        proc
        for proc in psutil.Process(stack.proc.pid).children(recursive=True)
        if "nemo_gym_ray_head.py" in " ".join(proc.cmdline())
    ]
    assert len(owners) == 1, owners
    return match[1], owners[0]


def eval_run(cwd: Path, head_url: str, rows: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("eval", "run", "--no-serve", "--head-url", head_url, "--input", rows, "--output", "out.jsonl")
    return subprocess.run(gym_command(*args, *extra), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_single_agent_turn_runs_materialized_tasks_routed_by_taskset(
    nemo_env: Path, tmp_path: Path, start_stack: Any
) -> None:
    """Taskset ``weather`` runs on NeMo Gym's environment, ``polygym_weather`` on polygym's
    ``example_single_tool_call`` (NeMo Gym's typed seed and close, its agent's tool calls)."""
    stack = start_stack("--model-type", "scripted_model", "--config", str(nemo_env), cwd=tmp_path)
    address, owner = ray_cluster(stack)  # one cluster, for the two servers that use Ray
    ray_pids = [owner.pid, *(proc.pid for proc in owner.children(recursive=True))]
    ray_folder = Path(owner.cmdline()[-1])
    hosts = listening_hosts(owner.pid)
    assert hosts and all(loopback(host) for host in hosts) and ray_folder.is_dir(), hosts
    for name in ("single_agent_turn", "polygym_episodes"):
        log = (Path(stack.record["log_dir"]) / f"{name}.log").read_text()
        assert f"Connecting to Ray cluster at specified address: {address}" in log
        assert "starting a new Ray cluster" not in log
    server = stack.server("single_agent_turn")
    assert (server["kind"], server["implementation"], server.get("nemo_gym")) == (
        "environment_servers",
        "single_agent_turn",
        True,
    )
    rows = [task(case, taskset) for taskset in ("weather", "polygym_weather") for case in ("right", "wrong")]
    write_jsonl([*rows, task("broken")], tmp_path / "in.jsonl")
    write_jsonl([task("right"), task("right", taskset="elsewhere")], tmp_path / "unrouted.jsonl")

    refused = eval_run(tmp_path, stack.record["head_url"], "unrouted.jsonl")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "unrouted.jsonl:2: task_id.taskset 'elsewhere': cannot route" in refused.stderr
    assert not (tmp_path / "out.jsonl").exists()

    done = eval_run(tmp_path, stack.record["head_url"], "in.jsonl", "--max-failures", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = RunFiles(tmp_path / "out.jsonl")
    rollouts = {
        (row["_ng_task_id"]["taskset"], row["_ng_task_id"]["task_id"]): row
        for row in iter_jsonl(files.output)
    }
    assert {key: row["reward"] for key, row in rollouts.items()} == {
        ("weather", "right"): 1.0,
        ("weather", "wrong"): 0.0,
        ("polygym_weather", "right"): 1.0,
        ("polygym_weather", "wrong"): 0.0,
    }
    servers = {"weather": "single_agent_turn", "polygym_weather": "polygym_episodes"}
    for (taskset, case), row in rollouts.items():
        assert row["_ng_task_id"] == {"taskset": taskset, "task_id": case}
        assert (row["_ng_environment_server"], row["_ng_result_type"]) == (
            servers[taskset],
            "single_agent_turn",
        )
        assert "agent_ref" not in row and row["response"]["output"]
    assert rollouts["polygym_weather", "right"]["called_city"] == "SF"  # polygym's verifier's own field
    (failure,) = iter_jsonl(files.failures)
    assert failure["_ng_task_id"] == {"taskset": "weather", "task_id": "broken"}
    assert failure["_ng_failure_class"] == failure["error_class"] == "environment_server_failed"
    assert (failure["_ng_failure_stage"], failure["_ng_failure_terminal"]) == ("agent", False)
    assert failure["_ng_environment_server"] == "single_agent_turn" and "reward" not in failure
    sent = [row["_ng_environment_server"] for row in iter_jsonl(files.materialized)]
    assert sent == [*["single_agent_turn"] * 2, *["polygym_episodes"] * 2, "single_agent_turn"]
    entries = {entry["_ng_environment_server"]: entry for entry in json.loads(files.metrics.read_text())}
    assert {name: entry["agent_metrics"]["mean/reward"] for name, entry in entries.items()} == {
        "single_agent_turn": 0.5,
        "polygym_episodes": 0.5,
    }
    assert entries["single_agent_turn"]["agent_metrics"]["num_failures"] == 1

    stack.stop()  # the cluster stops with the stack, its folder removed
    assert wait_until(lambda: all(gone(pid) for pid in ray_pids), 30), [p for p in ray_pids if not gone(p)]
    assert not ray_folder.exists()
