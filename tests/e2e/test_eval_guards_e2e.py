"""`gym eval run` guards end to end: one run per output, the stack a resume runs against, a server
dying under a self-served run, and the collector's timeout ending the rollout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import spec_from_flags
from polygym.collect.rollouts import Limits, collect
from polygym.collect.run_files import RunFiles, read_record
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.row import make_job
from polygym.stack import records as stacks
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from tests.conftest import gym_command, row_keys, run_gym, wait_until
from tests.e2e.test_eval_e2e import ENVS, SERVE, mixed_input

pytestmark = pytest.mark.e2e

LATENCY = "policy_model.responses_api_models.scripted_model.latency_ms"


def start_run(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        gym_command("eval", "run", *args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_run_on_one_output_is_refused_and_resume_stays_exact(tmp_path: Path) -> None:
    """Before the lock, two runs on one output each appended the same missing rollouts (duplicates)."""
    data = mixed_input(tmp_path / "in.jsonl")
    args = [*SERVE, "--input", str(data), "--output", "out.jsonl", "--num-repeats", "30"]
    args += ["--concurrency", "2", f"{LATENCY}=20"]
    out = tmp_path / "out.jsonl"
    first = start_run(*args, cwd=tmp_path)
    try:
        assert wait_until(lambda: out.exists() and len(row_keys(out)) >= 5, 60)
        second = run_gym("eval", "run", *args, "--resume", cwd=tmp_path)
        assert second.returncode == 2
        assert f"out.jsonl is being written by another run (pid {first.pid})" in second.stderr
        assert "wait for it or choose another --output" in second.stderr
        first.send_signal(signal.SIGINT)
    finally:
        finish(first)
    assert first.returncode == 130
    resumed = run_gym("eval", "run", *args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    final = row_keys(out)
    assert len(final) == len(set(final)) == 300
    materialized = [
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in iter_jsonl(RunFiles(out).materialized)
    ]
    assert len(materialized) == len(set(materialized)) == 300  # appended at dispatch, each job once


def test_resume_refuses_another_policy_unless_told(tmp_path: Path) -> None:
    data = mixed_input(tmp_path / "in.jsonl")
    args = ["eval", "run", *SERVE, "--input", str(data), "--output", "out.jsonl"]
    assert run_gym(*args, cwd=tmp_path).returncode == 0
    other = [*args, "--resume", "policy_model.responses_api_models.scripted_model.model=other-policy"]
    refused = run_gym(*other, cwd=tmp_path)
    assert refused.returncode == 2
    assert "the stack differs from the one the run started with" in refused.stderr
    assert "policy policy_model.model: 'scripted' -> 'other-policy'" in refused.stderr
    allowed = run_gym(*other, "--allow-stack-change", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    record = read_record(RunFiles(tmp_path / "out.jsonl"))
    assert record is not None
    assert record["stack"]["policy"]["policy_model"]["model"] == "other-policy"
    assert record["stack_changes"][0]["from"]["policy"]["policy_model"]["model"] == "scripted"


def test_a_dead_server_is_named_stops_only_its_environment_and_fails_the_run(tmp_path: Path) -> None:
    """Before the watch, the dead environment's remaining rollouts failed one by one and the run exited 0."""
    data = tmp_path / "in.jsonl"
    write_jsonl(load_blend(spec_from_flags(ENVS)).ordered("shuffled"), data)  # both keep having work
    args = [*SERVE, "--backend", "subprocess", "--input", str(data), "--output", "out.jsonl"]
    args += ["--num-repeats", "30", "--concurrency", "4", f"{LATENCY}=10"]
    out = tmp_path / "out.jsonl"
    run = start_run(*args, cwd=tmp_path)
    try:
        assert wait_until(lambda: any(r["pid"] == run.pid for r in stacks.list_stacks()), 60)
        [record] = [r for r in stacks.list_stacks() if r["pid"] == run.pid]
        victim = next(s for s in record["servers"] if s["name"] == "example_multi_step")
        assert wait_until(lambda: out.exists() and len(row_keys(out)) >= 10, 60)
        os.kill(victim["pid"], signal.SIGKILL)
        single_before = Counter(r["agent_ref"]["name"] for r in iter_jsonl(out))[f"{ENVS[0]}_simple_agent"]
        _, stderr = finish(run)
    finally:
        if run.poll() is None:
            finish(run, 5)
    assert run.returncode == 1, stderr
    named = f"server 'example_multi_step' (pid {victim['pid']}) killed by signal 9"
    assert f"server 'example_multi_step' died during the run: {named}" in " ".join(stderr.split())
    done = Counter(r["agent_ref"]["name"] for r in iter_jsonl(out))
    assert single_before < done[f"{ENVS[0]}_simple_agent"] == 150  # the other environment went on
    failures = list(iter_jsonl(RunFiles(out).failures))
    assert {f["agent_ref"]["name"] for f in failures} == {f"{ENVS[1]}_simple_agent"}
    assert done[f"{ENVS[1]}_simple_agent"] + len(failures) == 150
    died = [f for f in failures if f["error_class"] == "ServerDied"]
    assert len(died) >= len(failures) - 4  # at most the rollouts in flight failed their own way
    assert all("server 'example_multi_step' died" in f["error"] for f in died)


TICKER_APP = """
import os
from pydantic import BaseModel
from polygym import ResourcesServer, VerifyRequest, VerifyResponse, tool


class TickRequest(BaseModel):
    n: int


class Ticker(ResourcesServer):
    @tool
    async def tick(self, body: TickRequest) -> dict:
        \"\"\"Count one call: the model asks for one per turn.\"\"\"
        with open(os.environ["TICK_LOG"], "a") as log:
            log.write(f"{body.n}\\n")
        return {"ok": True}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse(**body.model_dump(), reward=1.0)
"""

TICKER_CONFIG = """
ticker:
  resources_servers:
    ticker: {}
ticker_simple_agent:
  responses_api_agents:
    simple_agent:
      resources_server: {type: resources_servers, name: ticker}
      model_server: {type: responses_api_models, name: policy_model}
      max_steps: 20
"""
TURNS = 6
TURN_MS = 400
TIMEOUT_S = 1.0
"""Six model turns of 0.4 s each (2.4 s) under a 1 s collector timeout: two turns finish, then
the rollout must be cancelled; uncancelled, all six tick by 2.5 s."""


def ticker_row() -> dict[str, Any]:
    script = [{"tool": "tick", "arguments": {"n": i}, "sleep_ms": TURN_MS} for i in range(TURNS)]
    tool = {
        "type": "function",
        "name": "tick",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    }
    return {
        "responses_create_params": {
            "input": "go",
            "tools": [tool],
            "metadata": {"script": json.dumps(script)},
        }
    }


@pytest.fixture
def ticker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment whose tool logs each call to $TICK_LOG (the returned path)."""
    env_dir = tmp_path / "resources_servers" / "ticker"
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "app.py").write_text(TICKER_APP)
    (env_dir / "configs" / "ticker.yaml").write_text(TICKER_CONFIG)
    log = tmp_path / "ticks.log"
    log.write_text("")
    monkeypatch.setenv("TICK_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    return log


def ticks(log: Path) -> int:
    return len(log.read_text().splitlines())


async def test_the_collector_timeout_cancels_an_in_process_rollout(ticker: Path) -> None:
    config = load_config(selector_paths(["ticker"], ["scripted_model"], []), env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    try:
        assert stack.client is not None
        began = time.monotonic()
        job = make_job(ticker_row(), "ticker_simple_agent", 0, 0)
        [result] = [r async for r in collect([job], stack.client, Limits(timeout_s=TIMEOUT_S))]
        assert result.failure is not None and result.failure["error_class"] == "Timeout"
        # The stack keeps running: an uncancelled rollout would go on calling the model.
        await asyncio.to_thread(wait_until, lambda: ticks(ticker) >= TURNS, began + 3.0 - time.monotonic())
        assert ticks(ticker) == 2
    finally:
        await stack.stop()


def test_the_collector_timeout_stops_a_rollout_over_http(ticker: Path, start_stack: Any) -> None:
    """The collector closes its connection to the agent at the timeout; the agent's server must
    then cancel the rollout: no model turn after the timeout."""
    start_stack(
        "--model-type",
        "scripted_model",
        "--resources-server",
        "ticker",
        "--backend",
        "subprocess",
        cwd=ticker.parent,
    )
    (ticker.parent / "in.jsonl").write_bytes(orjson.dumps(ticker_row()) + b"\n")
    began = time.monotonic()
    result = run_gym(
        "eval",
        "run",
        "--no-serve",
        "--input",
        "in.jsonl",
        "--output",
        "o.jsonl",
        "--timeout",
        str(TIMEOUT_S),
        cwd=ticker.parent,
    )
    assert result.returncode == 1, result.stderr  # its one rollout failed
    [failure] = iter_jsonl(ticker.parent / "o_failures.jsonl")
    assert failure["error_class"] == "Timeout"
    seen = ticks(ticker)
    wait_until(lambda: ticks(ticker) >= TURNS, max(0.0, began + 4.0 - time.monotonic()))
    assert ticks(ticker) == seen <= 3
