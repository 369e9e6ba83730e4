"""``X_aggregate_metrics.json``: the environment's own metrics over NeMo Gym's wire, and a visible
fallback to polygym's generic ones when the environment gives none."""

from __future__ import annotations

import gc
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.collect.eval_run import (
    METRICS_FALLBACK,
    MetricsInputs,
    RunSummary,
    _record,
    run_eval,
    write_aggregate_metrics,
)
from polygym.collect.rollouts import Limits, Result
from polygym.collect.run_files import RolloutWriter, RunFiles
from polygym.jsonl import count_rows, iter_jsonl, write_jsonl
from polygym.net.client import Reply, ServerCallError, ServerClient
from polygym.net.retry import NO_RETRY
from polygym.protocol import message_item, new_response
from polygym.row import NG_FAILURE_CLASS, NG_FAILURE_MESSAGE, NG_FAILURE_TERMINAL, TASK_INDEX, make_job

AGENT = "env_agent"


class NemoGymLikeAgent:
    """Answers ``/aggregate_metrics`` as a NeMo Gym server does: 422 without ``verify_responses``."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.bodies: list[dict[str, Any]] = []

    async def call(self, name: str, path: str, body: dict[str, Any], **_: Any) -> Reply:
        self.bodies.append(body)
        if self.down or "verify_responses" not in body:
            raise ServerCallError(name, "verify_responses Field required", status=422)
        own = {"agent_metrics": {"env_score": 0.5}, "key_metrics": {"env_score": 0.5}}
        return Reply(200, orjson.dumps({**own, "group_level_metrics": []}))


def run_files(tmp_path: Path) -> RunFiles:
    files = RunFiles(tmp_path / "out.jsonl")
    rows = [{"agent_ref": {"name": AGENT}, "reward": r, "_ng_task_index": i} for i, r in enumerate((1, 0))]
    write_jsonl(rows, files.output)
    write_jsonl([], files.failures)
    return files


async def test_the_environments_own_metrics_come_over_nemo_gyms_key(tmp_path: Path) -> None:
    agent = NemoGymLikeAgent()
    files = run_files(tmp_path)
    [entry] = await write_aggregate_metrics(files, cast(ServerClient, agent), RunSummary(total=2, skipped=0))
    assert [list(body) for body in agent.bodies] == [["verify_responses"]]
    assert entry["agent_metrics"]["env_score"] == 0.5
    assert METRICS_FALLBACK not in entry
    assert orjson.loads(files.metrics.read_bytes()) == [entry]


async def test_a_fallback_to_generic_metrics_is_warned_and_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = run_files(tmp_path)
    agent = NemoGymLikeAgent(down=True)
    [entry] = await write_aggregate_metrics(files, cast(ServerClient, agent), RunSummary(total=2, skipped=0))
    assert entry["agent_metrics"]["mean/reward"] == 0.5  # polygym's generic metrics stand in
    assert entry[METRICS_FALLBACK]["metrics"] == "polygym_generic"
    assert "verify_responses Field required" in entry[METRICS_FALLBACK]["error"]
    warning = capsys.readouterr().err
    assert f"warning: {AGENT}: /aggregate_metrics failed" in warning
    assert "verify_responses Field required" in warning


@pytest.mark.slow
def test_a_run_keeps_a_few_bytes_per_finished_rollout(tmp_path: Path) -> None:
    """What the collector keeps of each rollout it writes: its latency (8 bytes) and a bit for its
    repeat index. A list of latencies and the health monitor's records kept ~180 bytes each, which
    at 400 rollouts/s was 4 MiB a minute of a 10,000-in-flight run, for as long as it ran."""
    files = RunFiles(tmp_path / "out.jsonl")
    summary = RunSummary(total=0, skipped=0)
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}

    def result(i: int) -> Result:
        job = make_job({"responses_create_params": {"input": "hi"}}, AGENT, i % 4, i // 4)
        response = new_response([message_item("done")], "m", usage)
        return Result(job, 0.5 + i / 1e6, rollout={**job.row, "response": response, "reward": 1.0})

    with RolloutWriter(files) as writer:
        for i in range(1_000):
            _record(result(i), writer, summary)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1_000, 21_000):
                _record(result(i), writer, summary)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert summary.succeeded == 21_000 and count_rows(files.output) == 21_000
    assert len(summary.latencies[AGENT]) == 21_000 and summary.latencies[AGENT][-1] == 0.5 + 20_999 / 1e6
    assert kept < 20_000 * 12  # 8 bytes a latency, plus the array's headroom


async def test_metrics_kept_as_results_arrive_match_those_read_back_from_the_files(tmp_path: Path) -> None:
    """A run of its own rollouts sends the same reduced rollouts and writes the same entry as the
    read-back of its files (a resumed run's path), health counts and task-level findings included,
    and leaves its live health monitor as it was."""
    files = RunFiles(tmp_path / "out.jsonl")
    summary, live = RunSummary(total=0, skipped=0), MetricsInputs()
    usage = {"input_tokens": 1, "output_tokens": 0, "total_tokens": 1}
    with RolloutWriter(files) as writer:
        for i in range(6):
            job = make_job({"responses_create_params": {"input": "hi"}}, AGENT, i % 3, i // 3)
            if i == 5:
                failure = {**job.row, "error_class": "ConnectionReset", "error": "reset"}
                _record(Result(job, 0.1, failure=failure), writer, summary, live)
                continue
            rollout = {
                **job.row,
                "response": new_response([message_item("x")], "m", usage),
                "reward": i % 3 == 0,
            }
            _record(Result(job, 0.1, rollout=rollout), writer, summary, live)
    kinds_before = {env: dict(h.kinds) for env, h in summary.health.envs.items()}
    kept, read_back = NemoGymLikeAgent(), NemoGymLikeAgent()
    [from_live] = await write_aggregate_metrics(files, cast(ServerClient, kept), summary, live)
    [from_files] = await write_aggregate_metrics(files, cast(ServerClient, read_back), summary)
    assert from_live == from_files
    assert orjson.loads(orjson.dumps(kept.bodies)) == orjson.loads(orjson.dumps(read_back.bodies))
    assert from_live["agent_metrics"]["num_failures"] == 1
    assert from_live["agent_metrics"]["health/task_never_solved"] == 2  # tasks 1 and 2
    assert from_live["agent_metrics"]["health/zero_token_completion"] == 5
    assert {env: dict(h.kinds) for env, h in summary.health.envs.items()} == kinds_before


def typed_outcomes_agent(calls: Counter[int]) -> Starlette:
    """An agent whose server types task 0's outcome as a terminal failure (NeMo Gym's marker), and
    whose task 1 fails once (a 500) before it succeeds."""

    async def run(request: Request) -> JSONResponse:
        task = (await request.json())[TASK_INDEX]
        calls[task] += 1
        if task == 0:
            terminal = {NG_FAILURE_CLASS: "environment_server_failed", NG_FAILURE_TERMINAL: True}
            return JSONResponse({"reward": 0.0, **terminal, NG_FAILURE_MESSAGE: "the task cannot run"})
        if calls[task] == 1:
            return JSONResponse({"error": "flaky"}, status_code=500)
        return JSONResponse({"reward": 1.0})

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


async def test_resume_runs_failures_again_except_those_marked_terminal(tmp_path: Path) -> None:
    calls: Counter[int] = Counter()
    client = ServerClient()
    client.add_local(AGENT, typed_outcomes_agent(calls))
    jobs = [make_job({"responses_create_params": {"input": "hi"}}, AGENT, task, 0) for task in range(2)]
    files = RunFiles(tmp_path / "out.jsonl")
    limits = Limits(concurrency=2, retry=NO_RETRY)
    first = await run_eval(client, jobs, files, limits, aggregate=False)
    assert first.failed == 2 and calls == Counter({0: 1, 1: 1})
    resumed = await run_eval(client, jobs, files, limits, resume=True, aggregate=False)
    assert resumed.skipped == 1 and resumed.succeeded == 1 and calls == Counter({0: 1, 1: 2})
    [kept] = iter_jsonl(files.failures)
    assert kept[TASK_INDEX] == 0 and kept[NG_FAILURE_TERMINAL] is True
    assert [r[TASK_INDEX] for r in iter_jsonl(files.output)] == [1]
