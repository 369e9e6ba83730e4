"""`gym eval run` end to end: routing, files, failures, interruption and exact resume."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import spec_from_flags
from polygym.collect.dataset import Materialization, load_jobs
from polygym.collect.eval_run import run_eval
from polygym.collect.rollouts import Limits, collect
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from responses_api_models.scripted_model.app import ScriptedModel
from tests.conftest import BOOM_APP, interrupt_gym, row_keys, run_gym, wait_until

pytestmark = pytest.mark.e2e

ENVS = ("example_single_tool_call", "example_multi_step")
NG_PERF_TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "token_observability_coverage")
"""What ``ng_perf`` says of tokens when the model counts them (no cached or reasoning tokens here)."""
SERVE = ["--model-type", "scripted_model", *[a for e in ENVS for a in ("--resources-server", e)]]


def mixed_input(path: Path) -> Path:
    """Both environments' example rows, each stamped with its agent (`gym data blend --order concat`)."""
    write_jsonl(load_blend(spec_from_flags(ENVS)).ordered("concat"), path)
    return path


@pytest.fixture
def scripted_upstream() -> Iterator[str]:
    """A scripted model served on loopback from a thread, standing in for a hosted API."""
    loop = asyncio.new_event_loop()
    config = load_config(selector_paths([], ["scripted_model"], []), env_files=[])
    server = AppServer(ScriptedModel("upstream", config.servers["policy_model"].config).app, bind_socket())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    yield server.url + "/v1"
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_guide_flow_through_openai_model(tmp_path: Path, start_stack: Any, scripted_upstream: str) -> None:
    start_stack(
        "--model-type",
        "openai_model",
        "--resources-server",
        ENVS[0],
        "--resources-server",
        ENVS[1],
        f"policy_base_url={scripted_upstream}",
        "policy_api_key=sk-test",
        "policy_model_name=scripted",
    )
    mixed_input(tmp_path / "results" / "test_multiverifier_input.jsonl")
    result = run_gym(
        "eval",
        "run",
        "--no-serve",
        "--input",
        "results/test_multiverifier_input.jsonl",
        "--output",
        "results/test_multiverifier_outputs.jsonl",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    files = RunFiles(tmp_path / "results" / "test_multiverifier_outputs.jsonl")
    assert all(p.exists() for p in files.all())
    rollouts = list(iter_jsonl(files.output))
    assert len(rollouts) == 10
    for rollout in rollouts:
        tools = {t["name"] for t in rollout["responses_create_params"]["tools"]}
        expected = ENVS[0] if "get_weather" in tools else ENVS[1]
        assert rollout["agent_ref"]["name"] == f"{expected}_simple_agent"
        assert rollout["reward"] == 1.0
        assert rollout["response"]["model"] == "scripted"
        perf = rollout["ng_perf"]  # NeMo Gym's per-rollout record, under its key names
        assert set(perf) == {*NG_PERF_TOKEN_KEYS, "num_turns", "num_tool_calls", "total_latency_ms"}
        assert perf["num_turns"] == perf["num_tool_calls"] + 1 and perf["total_latency_ms"] > 0
        assert perf["prompt_tokens"] == rollout["response"]["usage"]["input_tokens"]
    assert sorted(row_keys(files.output)) == [(t, 0) for t in range(10)]
    assert len(list(iter_jsonl(files.materialized))) == 10
    assert list(iter_jsonl(files.failures)) == []
    metrics = orjson.loads(files.metrics.read_bytes())
    assert sorted(m["agent_ref"]["name"] for m in metrics) == sorted(f"{e}_simple_agent" for e in ENVS)
    for entry in metrics:
        assert entry["agent_metrics"]["mean/reward"] == 1.0 and entry["agent_metrics"]["num_rollouts"] == 5
        assert entry["key_metrics"]["num_failures"] == 0
        assert len(entry["group_level_metrics"]) == 5
        assert entry["perf_summary"]["overall_observability_coverage"] == 1.0  # of the ng_perf records
    assert "per-environment metrics" in result.stdout


def test_bad_rows_and_unknown_agent_stop_the_run(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    mixed_input(data)
    lines = data.read_bytes().splitlines()
    broken = orjson.loads(lines[3])
    broken["agent_ref"]["name"] = "example_multi_stp_simple_agent"
    lines[3] = orjson.dumps(broken)
    lines[6] = b'{"responses_create_params": {"tools": []}}'
    data.write_bytes(b"\n".join(lines) + b"\n")
    result = run_gym(
        "eval", "run", *SERVE, "--input", str(data), "--output", str(tmp_path / "out.jsonl"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert (
        f"{data}:4: agent_ref.name: unknown agent 'example_multi_stp_simple_agent'. Did you mean"
        in result.stderr
    )
    assert f"{data}:7: responses_create_params.input: missing" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


BOOM_CONFIG = """
boom:
  resources_servers:
    boom: {}
boom_simple_agent:
  responses_api_agents:
    simple_agent:
      resources_server: {type: resources_servers, name: boom}
      model_server: {type: responses_api_models, name: policy_model}
"""


def test_verifier_exception_becomes_a_recorded_failure(tmp_path: Path) -> None:
    env_dir = tmp_path / "resources_servers" / "boom"
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "app.py").write_text(BOOM_APP)
    (env_dir / "configs" / "boom.yaml").write_text(BOOM_CONFIG)
    rows = [{"responses_create_params": {"input": f"q{i}"}, "explode": i % 2 == 1} for i in range(4)]
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    args = [
        "eval",
        "run",
        "--model-type",
        "scripted_model",
        "--resources-server",
        "boom",
        "--input",
        "in.jsonl",
    ]
    result = run_gym(*args, "--output", "out.jsonl", "--max-failures", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = RunFiles(tmp_path / "out.jsonl")
    assert sorted(row_keys(files.output)) == [(0, 0), (2, 0)]
    failures = list(iter_jsonl(files.failures))
    assert sorted(f["_ng_task_index"] for f in failures) == [1, 3]
    for failure in failures:
        assert failure["error_class"] == "HTTP 500"
        assert "verifier exploded on purpose" in failure["error"]
        assert failure["agent_ref"]["name"] == "boom_simple_agent"
        assert failure["row"]["explode"] is True
    assert "2 failed" in result.stdout
    strict = run_gym(*args, "--output", "strict.jsonl", "--max-failures", "1", cwd=tmp_path)
    assert strict.returncode == 1 and "2 of 4 rollouts failed (HTTP 500: 2)" in strict.stderr


async def test_server_killed_mid_run_then_resume_after_restart(tmp_path: Path) -> None:
    overrides = ["policy_model.responses_api_models.scripted_model.latency_ms=15"]
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), overrides, env_files=[])
    stack = Stack(config, backend="subprocess", head_port=0, record=False)
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        data = mixed_input(tmp_path / "in.jsonl")
        jobs = load_jobs(data, [f"{e}_simple_agent" for e in ENVS], options=Materialization(num_repeats=12))
        files = RunFiles(tmp_path / "out.jsonl")
        victim = next(s for s in stack.servers() if s["name"] == "example_multi_step")
        run = asyncio.ensure_future(run_eval(client, jobs, files, Limits(concurrency=8)))
        await asyncio.to_thread(wait_until, lambda: len(row_keys(files.output)) >= 20, 30)
        os.kill(victim["pid"], signal.SIGKILL)
        summary = await asyncio.wait_for(run, 120)
        failures = list(iter_jsonl(files.failures))
        assert summary.failed == len(failures) > 0
        assert {f["agent_ref"]["name"] for f in failures} == {"example_multi_step_simple_agent"}
        done_by_agent = Counter(r["agent_ref"]["name"] for r in iter_jsonl(files.output))
        assert done_by_agent["example_single_tool_call_simple_agent"] == 60  # unaffected
        await stack.restart("example_multi_step")
        resumed = await run_eval(client, jobs, files, Limits(concurrency=8), resume=True)
        assert resumed.skipped == 120 - len(failures) and resumed.failed == 0
        final = row_keys(files.output)
        assert len(final) == len(set(final)) == 120
        assert set(final) == {job.key for job in jobs}
        assert list(iter_jsonl(files.failures)) == []
    finally:
        await client.close()
        await stack.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupt_then_resume_is_exact(tmp_path: Path, sig: signal.Signals) -> None:
    data = mixed_input(tmp_path / "in.jsonl")
    args = [
        "eval",
        "run",
        *SERVE,
        "--input",
        str(data),
        "--output",
        "out.jsonl",
        "--num-repeats",
        "30",
        "--concurrency",
        "4",
        "policy_model.responses_api_models.scripted_model.latency_ms=10",
    ]
    out = tmp_path / "out.jsonl"
    returncode, stderr = interrupt_gym(args, tmp_path, out, 20, sig)
    if sig == signal.SIGINT:
        assert returncode == 130
        assert "resume with:" in stderr and "--resume" in stderr
    else:
        assert returncode == -signal.SIGKILL
    partial = row_keys(out)
    assert 20 <= len(partial) < 300
    result = run_gym(*args, "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    final = row_keys(out)
    assert len(final) == len(set(final)) == 300
    assert f"{300 - len(partial)} rollouts collected, {len(partial)} already done" in result.stdout


def test_resume_refuses_a_changed_input(tmp_path: Path) -> None:
    data = mixed_input(tmp_path / "in.jsonl")
    args = ["eval", "run", *SERVE, "--input", str(data), "--output", "out.jsonl"]
    assert run_gym(*args, cwd=tmp_path).returncode == 0
    again = run_gym(*args, cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr and "--overwrite" in again.stderr
    data.write_bytes(data.read_bytes() * 2)  # the same 10 rows again: the input changed
    changed = run_gym(*args, "--resume", cwd=tmp_path)
    assert changed.returncode == 2
    assert "the input or the run options changed" in changed.stderr
    assert len(row_keys(tmp_path / "out.jsonl")) == 10


async def test_python_api_streams_results_in_the_callers_loop(tmp_path: Path) -> None:
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    try:
        jobs = load_jobs(
            mixed_input(tmp_path / "in.jsonl"),
            [f"{e}_simple_agent" for e in ENVS],
            options=Materialization(num_repeats=3),
        )
        assert stack.client is not None
        results = [r async for r in collect(jobs, stack.client, Limits(concurrency=5))]
        assert len(results) == 30 and all(r.ok for r in results)
        assert {r.job.key for r in results} == {j.key for j in jobs}
        first_two = []
        async for result in collect(jobs, stack.client, Limits(concurrency=2)):
            first_two.append(result)
            if len(first_two) == 2:
                break  # stopping early cancels the rest without hanging
        assert len(first_two) == 2
    finally:
        await stack.stop()
