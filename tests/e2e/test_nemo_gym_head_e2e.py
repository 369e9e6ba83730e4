"""Each project's collector against the other's stack, through the other's head server.

One direction: NeMo Gym 0.7.0's own ``gym eval run --no-serve`` (its collector, run in NeMo Gym's
environment) pointed at the head of a polygym stack (``gym env start``, scripted model, both
example environments) collects every row with reward 1.0. The other: polygym's ``gym eval run
--no-serve --head-url`` pointed at the head of NeMo Gym's own stack, started by NeMo Gym's ``gym
env start`` (its ``openai_model`` aimed at polygym's scripted model, since NeMo Gym ships no model
server that needs no key) collects every row of NeMo Gym's ``example_single_tool_call`` data.

NeMo Gym runs in the environment of ``tests/nemo_gym_tools.py`` (built once, cached); its servers
reuse that environment through its own ``uv_venv_dir`` / ``skip_venv_if_present`` settings, so
nothing is installed. Everything listens on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.jsonl import iter_jsonl
from polygym.net.child_port import port_for_a_child
from tests.conftest import ROOT, run_gym
from tests.nemo_gym_stack import NemoGymStack, site_packages, stack_settings
from tests.nemo_gym_tools import nemo_gym_command, run_nemo_gym, tools_python

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym]

ENVIRONMENTS = ("example_single_tool_call", "example_multi_step")
NEMO_ENV = "example_single_tool_call"
NEMO_AGENT = f"{NEMO_ENV}_simple_agent"
NEMO_SERVER_FOLDERS = (
    f"resources_servers/{NEMO_ENV}",
    "responses_api_agents/simple_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
)
"""The folders NeMo Gym's stack runs: the environment, its agent, the model and 0.7's relay."""


@pytest.fixture(scope="module")
def ng_python() -> Path:
    return tools_python()


def rewards_by_agent(path: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for row in iter_jsonl(path):
        found.setdefault(row["agent_ref"]["name"], []).append(row["reward"])
    return found


def test_nemo_gyms_collector_collects_from_a_polygym_stack(
    start_stack: Any, tmp_path: Path, ng_python: Path
) -> None:
    selectors = [arg for env in ENVIRONMENTS for arg in ("--resources-server", env)]
    stack = start_stack("--model-type", "scripted_model", *selectors, "--head-port", "0")
    head_port = stack.record["head_url"].rsplit(":", 1)[1]
    rows = [
        row
        for env in ENVIRONMENTS
        for row in iter_jsonl(ROOT / "resources_servers" / env / "data" / "example.jsonl")
    ]
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    done = run_nemo_gym(
        ng_python,
        *("eval", "run", "--no-serve", "--input", "in.jsonl", "--output", "ng.jsonl"),
        *("++head_server.host=127.0.0.1", f"++head_server.port={head_port}"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = {f"{env}_simple_agent": [1.0] * 5 for env in ENVIRONMENTS}
    assert rewards_by_agent(tmp_path / "ng.jsonl") == expected
    metrics = orjson.loads((tmp_path / "ng_aggregate_metrics.json").read_bytes())
    assert {entry["agent_ref"]["name"]: entry["agent_metrics"]["mean/reward"] for entry in metrics} == {
        agent: 1.0 for agent in expected
    }


@pytest.fixture
def nemo_gym_stack(start_stack: Any, tmp_path: Path, ng_python: Path) -> Iterator[NemoGymStack]:
    model = start_stack("--model-type", "scripted_model", "--head-port", "0")
    head_port = port_for_a_child("127.0.0.1")
    settings = stack_settings(
        ng_python, NEMO_SERVER_FOLDERS, model.server("policy_model")["url"] + "/v1", head_port, tmp_path
    )
    args = ["env", "start", "--resources-server", NEMO_ENV, "--model-type", "openai_model", *settings]
    stack = NemoGymStack(nemo_gym_command(ng_python, *args), tmp_path, head_port)
    try:
        yield stack
    finally:
        stack.stop()


def test_polygyms_collector_collects_from_a_nemo_gym_stack(
    nemo_gym_stack: NemoGymStack, tmp_path: Path, ng_python: Path
) -> None:
    data = site_packages(ng_python) / "resources_servers" / NEMO_ENV / "data" / "example.jsonl"
    rows = len(list(iter_jsonl(data)))
    done = run_gym(
        *("eval", "run", "--no-serve", "--head-url", nemo_gym_stack.head_url, "--agent", NEMO_AGENT),
        *("--input", str(data), "--output", "pg.jsonl"),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert rewards_by_agent(tmp_path / "pg.jsonl") == {NEMO_AGENT: [1.0] * rows}
    for row in iter_jsonl(tmp_path / "pg.jsonl"):
        calls = [item for item in row["response"]["output"] if item["type"] == "function_call"]
        assert [call["name"] for call in calls] == ["get_weather"]
    assert list(iter_jsonl(tmp_path / "pg_failures.jsonl")) == []
    [entry] = orjson.loads((tmp_path / "pg_aggregate_metrics.json").read_bytes())
    perf = entry["perf_summary"]  # NeMo Gym's agent summarised polygym's ng_perf records
    assert perf["overall_observability_coverage"] == 1.0 and perf["token_observability_coverage"] == 1.0
    assert perf["mean_num_turns"] == 2.0 and perf["total_latency_p50_ms"] > 0
