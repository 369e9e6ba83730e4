"""collect: --timeout bounds the whole rollout, retries included; a dead server stops only its agents."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.collect.rollouts import Limits, collect, failure_record
from polygym.collect.stack_watch import SERVER_DIED, StackHealth
from polygym.net.client import ServerClient
from polygym.net.retry import RetryPolicy
from polygym.row import Job, make_job

RETRY_FAST = RetryPolicy(attempts=4, base_delay_s=0.01, max_delay_s=0.01)


def slow_failing_agent(calls: list[float], delay_s: float) -> Starlette:
    """An agent whose every /run answers 503 after ``delay_s``: a retried rollout."""

    async def run(request: Request) -> JSONResponse:
        calls.append(time.monotonic())
        await asyncio.sleep(delay_s)
        return JSONResponse({"error": "busy"}, status_code=503)

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


def job(agent: str, task: int = 0) -> Job:
    return make_job({"responses_create_params": {"input": "hi"}}, agent, task, 0)


async def test_the_timeout_ends_the_rollout_not_each_attempt() -> None:
    """Attempts of 0.6 s under a 1 s timeout: two calls, then the rollout is cancelled as a Timeout;
    before, each attempt had the whole timeout and the rollout ran four attempts (2.4 s)."""
    calls: list[float] = []
    client = ServerClient()
    client.add_local("agent", slow_failing_agent(calls, 0.6))
    began = time.monotonic()
    limits = Limits(concurrency=1, timeout_s=1.0, retry=RETRY_FAST)
    [result] = [r async for r in collect([job("agent")], client, limits)]
    assert result.failure is not None and result.failure["error_class"] == "Timeout"
    assert "no result within 1s" in result.failure["error"]
    assert 0.9 < result.latency_s < 1.5
    await asyncio.sleep(max(0.0, began + 2.5 - time.monotonic()))  # when a third attempt would run
    assert len(calls) == 2 and all(t < began + 1.0 for t in calls)


async def test_the_timeout_closes_the_connection_to_the_agent() -> None:
    """Over HTTP, cancelling the rollout must close its connection: that is the only way the
    agent's server can learn that nobody waits for the rollout any more (and stop it)."""
    closed = asyncio.Event()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request arrived; no reply ever comes
        while await reader.read(1024):
            pass
        closed.set()  # EOF: the collector closed its end
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ServerClient()
    client.set_address("agent", f"http://127.0.0.1:{port}")
    try:
        limits = Limits(concurrency=1, timeout_s=0.5, retry=RETRY_FAST)
        [result] = [r async for r in collect([job("agent")], client, limits)]
        assert result.failure is not None and result.failure["error_class"] == "Timeout"
        await asyncio.wait_for(closed.wait(), 5.0)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_dead_server_stops_the_agents_that_need_it_and_no_others() -> None:
    ran: list[str] = []

    def agent(name: str) -> Starlette:
        async def run(request: Request) -> JSONResponse:
            ran.append(name)
            return JSONResponse({"reward": 1.0})

        return Starlette(routes=[Route("/run", run, methods=["POST"])])

    client = ServerClient()
    client.add_local("a_agent", agent("a_agent"))
    client.add_local("b_agent", agent("b_agent"))
    health = StackHealth({"a_agent": {"a_env", "policy"}, "b_agent": {"b_env", "policy"}})
    health.server_died("a_env", "server 'a_env' (pid 1) killed by signal 9")
    jobs = [job("a_agent", 0), job("b_agent", 1), job("a_agent", 2)]
    results = [r async for r in collect(jobs, client, Limits(concurrency=2), health)]
    assert ran == ["b_agent"]
    failures = sorted((r.job.task_index, r.failure["error_class"]) for r in results if r.failure)
    assert failures == [(0, SERVER_DIED), (2, SERVER_DIED)]
    assert all("server 'a_env' died" in r.failure["error"] for r in results if r.failure)
    health.server_died("policy", "gone")
    assert health.blocker("b_agent") == "policy"


@pytest.mark.parametrize(
    ("error_class", "ng_class", "status"),
    [
        ("RateLimited", "agent_request_failed", None),
        ("Timeout", "agent_request_failed", None),
        ("HTTP 503", "agent_request_failed", 503),
        ("HTTP 422", "agent_run_error", 422),
        ("BadJSON", "agent_run_error", None),
        ("judge_failed", "agent_run_error", None),
    ],
)
def test_failure_rows_carry_nemo_gym_failure_keys(
    error_class: str, ng_class: str, status: int | None
) -> None:
    job = make_job({"responses_create_params": {"input": "hi"}}, "env_simple_agent", 3, 1)
    record = failure_record(job, error_class, "it broke", 0.5)
    assert (record["error_class"], record["error"]) == (error_class, "it broke")  # polygym's own keys stay
    assert record["_ng_failure_class"] == ng_class
    assert record["_ng_failure_type"] == error_class
    assert record["_ng_failure_message"] == "it broke"
    assert record["_ng_failure_http_status"] == status
    assert record["_ng_failure_terminal"] is False


async def test_results_carry_the_rows_collector_fields_whatever_the_agent_answers() -> None:
    """NeMo Gym 0.7's collector copies ``agent_ref``, ``task_source``, ``_ng_attempt_index``,
    ``_ng_rollout_id``... from the row onto the result; an agent echoing nothing loses none."""

    async def run(request: Request) -> JSONResponse:
        row = await request.json()
        ok = row["task_source"] == "ok"
        return JSONResponse({"reward": 1.0}) if ok else JSONResponse({"error": "no"}, status_code=400)

    client = ServerClient()
    client.add_local("agent", Starlette(routes=[Route("/run", run, methods=["POST"])]))
    extra = {"_ng_rollout_id": "r-7", "_ng_attempt_index": 2, "skills_ref": {"name": "s"}}
    jobs = [
        make_job({"responses_create_params": {"input": "hi"}, "task_source": source, **extra}, "agent", t, 0)
        for t, source in enumerate(["ok", "bad"])
    ]
    results = sorted([r async for r in collect(jobs, client)], key=lambda r: r.job.task_index)
    rollout, failure = results[0].rollout, results[1].failure
    assert rollout is not None and failure is not None
    for result, source in ((rollout, "ok"), (failure, "bad")):
        assert result["task_source"] == source and result["skills_ref"] == {"name": "s"}
        assert (result["_ng_rollout_id"], result["_ng_attempt_index"]) == ("r-7", 2)
        assert result["agent_ref"]["name"] == "agent"
    assert "responses_create_params" not in rollout


def test_a_failure_carries_its_attempt_and_no_reward() -> None:
    """A typed failure is a record of its own (class, message, attempt), never a reward-0 rollout."""
    retried = make_job(
        {"responses_create_params": {"input": "hi"}, "_ng_attempt_index": 2}, "env_agent", 3, 1
    )
    record = failure_record(retried, "ConnectionRefused", "cannot reach upstream", 0.1)
    assert record["_ng_attempt_index"] == 2 and record["error_class"] == "ConnectionRefused"
    assert "reward" not in record and "response" not in record


async def test_a_result_the_server_types_as_failed_is_a_failure_not_a_reward() -> None:
    """NeMo Gym's typed outcome (gdp_pdf's verifier: ``judge_failed`` with reward 0.0 when its judge
    gives no verdict) goes to the failures, as NeMo Gym's collector and reverify send it."""

    async def run(request: Request) -> JSONResponse:
        row = await request.json()
        if row["judge"] == "ok":
            return JSONResponse({"reward": 0.0})
        typed = {"_ng_failure_class": "judge_failed", "_ng_failure_message": "criterion 1 unparseable"}
        return JSONResponse({"reward": 0.0, "mask_sample": True, **typed})

    client = ServerClient()
    client.add_local("agent", Starlette(routes=[Route("/run", run, methods=["POST"])]))
    jobs = [
        make_job({"responses_create_params": {"input": "hi"}, "judge": j}, "agent", t, 0)
        for t, j in enumerate(["ok", "no"])
    ]
    results = sorted([r async for r in collect(jobs, client)], key=lambda r: r.job.task_index)
    assert results[0].rollout is not None and results[0].rollout["reward"] == 0.0
    failure = results[1].failure
    assert results[1].rollout is None and failure is not None
    assert (failure["error_class"], failure["error"]) == ("judge_failed", "criterion 1 unparseable")
    assert failure["_ng_failure_class"] == "judge_failed" and "reward" not in failure
