"""The collection engine: run jobs against their agents at bounded concurrency, never hang.

``collect`` is an async iterator of results, usable as is from a training loop running in its own
event loop (no global state, no blocking calls). It keeps at most ``concurrency`` rollouts in
flight (and at most the per-agent limit for an agent), buffers at most a few results ahead of the
consumer, and turns every error into a ``Result`` with a failure record instead of raising:
one broken environment must not stop the others.

An agent whose server is unreachable is marked down after one rollout exhausts its retries; its
next rollouts then fail after a single attempt instead of a full backoff each, until one succeeds.
With a ``StackHealth`` (a stack whose servers are watched), an agent that needs a dead server is
not called at all: its rollouts are recorded as ``ServerDied`` at once, and the others go on.

``timeout_s`` bounds a whole rollout, retries and backoff included: when it passes, the call is
cancelled (which closes its connection to the agent, so the agent's server can stop the rollout
and release its session) and the rollout is recorded as a ``Timeout`` failure. A per-attempt
timeout alone let a rollout retried after 5xx replies run for several times ``--timeout``.

What one job *is* is a ``JobCall``: by default the agent's ``/run`` (``run_call``); ``gym eval
reverify`` passes its seed/verify/end call instead, so both get this one implementation of
concurrency, timeouts, down servers and failure records.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from polygym.collect.episodes import EPISODE_STAMPS, episode_record, episode_request
from polygym.collect.health import QUARANTINED, HealthMonitor
from polygym.collect.perf_record import with_perf_record
from polygym.collect.stack_watch import SERVER_DIED, StackHealth
from polygym.kinds import AGENT_KIND
from polygym.net import failure
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.retry import RetryPolicy
from polygym.row import (
    ENVIRONMENT_SERVER,
    NG_FAILURE_CLASS,
    NG_FAILURE_HTTP_STATUS,
    NG_FAILURE_MESSAGE,
    NG_FAILURE_PREFIX,
    NG_FAILURE_TERMINAL,
    NG_FAILURE_TYPE,
    ROLLOUT_INDEX,
    TASK_INDEX,
    Job,
    carried,
)

DEFAULT_CONCURRENCY = 64
MAX_CONCURRENCY = 16_384
"""One task per slot is created up front; beyond this, a typo costs memory, not throughput."""
DEFAULT_TIMEOUT_S = 900.0
TIMEOUT_CLASS = "Timeout"
RUN_RETRY = RetryPolicy(attempts=4, base_delay_s=0.25, max_delay_s=4.0)
DOWN_RETRY = RetryPolicy(attempts=1)


@dataclass
class Result:
    """The outcome of one job: ``rollout`` on success, ``failure`` otherwise."""

    job: Job
    latency_s: float
    rollout: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.rollout is not None


@dataclass
class Limits:
    concurrency: int = DEFAULT_CONCURRENCY
    per_agent: dict[str, int] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = RUN_RETRY

    def __post_init__(self) -> None:
        for who, count in [("concurrency", self.concurrency), *self.per_agent.items()]:
            if not 1 <= count <= MAX_CONCURRENCY:
                raise ValueError(f"concurrency for {who}: must be from 1 to {MAX_CONCURRENCY}, got {count}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be more than 0 seconds, got {self.timeout_s}")


REQUEST_FAILED_CLASSES = frozenset(
    {
        failure.TIMEOUT,
        failure.CONNECTION_REFUSED,
        failure.CONNECTION_RESET,
        failure.RATE_LIMITED,
        failure.UPSTREAM_5XX,
        SERVER_DIED,
    }
)
"""Failures of the request itself rather than of the rollout's work: NeMo Gym 0.7 files these (no
status, or 429/502/503/504) as ``agent_request_failed``, everything else as ``agent_run_error``."""
REQUEST_FAILED_STATUSES = frozenset({429, 502, 503, 504})


def http_status(error_class: str) -> int | None:
    """The status of an ``HTTP <status>`` class (a callee's own error), else None."""
    prefix, _, code = error_class.partition(" ")
    return int(code) if prefix == "HTTP" and code.isdigit() else None


def nemo_gym_failure_fields(error_class: str, message: str) -> dict[str, Any]:
    """The ``_ng_failure_*`` keys NeMo Gym 0.7 writes on a failure row, so its tools (health-check,
    reverify, profile) read polygym's ``_failures.jsonl`` as their own. polygym's own keys stay."""
    status = http_status(error_class)
    request_failed = error_class in REQUEST_FAILED_CLASSES or status in REQUEST_FAILED_STATUSES
    return {
        NG_FAILURE_CLASS: "agent_request_failed" if request_failed else "agent_run_error",
        NG_FAILURE_TYPE: error_class,
        NG_FAILURE_MESSAGE: message,
        NG_FAILURE_HTTP_STATUS: status,
        NG_FAILURE_TERMINAL: False,  # every failure here can be run again (--resume)
    }


def typed_failure(result: dict[str, Any]) -> tuple[str, str] | None:
    """``(class, message)`` when a server's result says it failed (NeMo Gym's typed outcome: a
    ``_ng_failure_class``, e.g. ``judge_failed`` from a verifier whose judge gave no verdict, with
    its ``reward`` 0.0). NeMo Gym's collection and reverify write such a result to the failures
    file, never to the scored rollouts: its reward is not a score."""
    kind = result.get(NG_FAILURE_CLASS)
    if kind is None:
        return None
    message = result.get(NG_FAILURE_MESSAGE) or result.get("error") or f"the server says {kind}"
    return str(kind), str(message)


def routed_to(job: Job) -> dict[str, Any]:
    """Who ran the job, as its records say it: the environment server a materialized task row was
    stamped with (such a row names no agent, as in NeMo Gym), else its agent."""
    if ENVIRONMENT_SERVER in job.row:
        return {ENVIRONMENT_SERVER: job.agent}
    return {"agent_ref": {"type": AGENT_KIND, "name": job.agent}}


def failure_record(job: Job, error_class: str, message: str, latency_s: float) -> dict[str, Any]:
    """A ``_failures.jsonl`` line: enough to find the row, see what broke, and rerun it."""
    return {
        **carried(job.row),
        **routed_to(job),
        TASK_INDEX: job.task_index,
        ROLLOUT_INDEX: job.rollout_index,
        "error_class": error_class,
        "error": message,
        "latency_s": round(latency_s, 4),
        "time": time.time(),
        "row": job.row,
        **nemo_gym_failure_fields(error_class, message),
    }


JobCall = Callable[[Job, float, RetryPolicy], Awaitable[Any]]
"""The request(s) of one job, given its timeout and retry policy; returns the reply's JSON body,
which must be a result with a ``reward``. Raising ``ServerCallError`` (or anything) fails the job."""


def run_call(client: ServerClient, result_types: dict[str, str] | None = None) -> JobCall:
    """A job as a rollout: POST the row to its agent's ``/run``; the rollout gets its ``ng_perf``.
    A materialized task row goes to its environment server's ``/run`` as an episode
    (``collect.episodes``), its reply stamped with that server's implementation (``result_types``)."""
    types = result_types or {}

    async def call(job: Job, timeout_s: float, retry: RetryPolicy) -> Any:
        began = time.perf_counter()
        episode = ENVIRONMENT_SERVER in job.row
        body = episode_request(job.row) if episode else job.row
        reply = (await client.call(job.agent, "/run", body, timeout_s=timeout_s, retry=retry)).json()
        if episode:
            reply = episode_record(reply, job.agent, types.get(job.agent))
        return with_perf_record(reply, time.perf_counter() - began)

    return call


class _Runner:
    """Runs single jobs; tracks which agents are down."""

    def __init__(
        self, call: JobCall, limits: Limits, health: StackHealth | None, monitor: HealthMonitor | None
    ) -> None:
        self.call = call
        self.limits = limits
        self.health = health
        self.monitor = monitor
        self.down: set[str] = set()
        self.agent_slots = {a: asyncio.Semaphore(n) for a, n in limits.per_agent.items()}

    async def run(self, job: Job) -> Result:
        slot = self.agent_slots.get(job.agent)
        async with slot if slot is not None else contextlib.nullcontext():
            if (dead := self._blocker(job)) is not None:
                return Result(job, 0.0, failure=failure_record(job, SERVER_DIED, dead, 0.0))
            if self.monitor is not None and (why := self.monitor.quarantined.get(job.agent)) is not None:
                message = f"not run: environment quarantined ({why})"
                return Result(job, 0.0, failure=failure_record(job, QUARANTINED, message, 0.0))
            return await self._run(job)

    def _blocker(self, job: Job) -> str | None:
        server = self.health.blocker(job.agent) if self.health is not None else None
        return None if server is None else f"not run: server '{server}' died"

    def _failed(self, job: Job, began: float, error_class: str, message: str) -> Result:
        """A failure; one that a dead server explains is recorded as that (it is why it failed)."""
        if (dead := self._blocker(job)) is not None:
            error_class, message = SERVER_DIED, f"{dead} ({error_class}: {message})"
        latency = time.perf_counter() - began
        return Result(job, latency, failure=failure_record(job, error_class, message, latency))

    async def _run(self, job: Job) -> Result:
        began = time.perf_counter()
        retry = DOWN_RETRY if job.agent in self.down else self.limits.retry
        timeout_s = self.limits.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                rollout = await self.call(job, timeout_s, retry)
            if not isinstance(rollout, dict) or ("reward" not in rollout and typed_failure(rollout) is None):
                raise ValueError(f"'{job.agent}' returned no reward: {str(rollout)[:300]}")
        except TimeoutError:
            return self._failed(job, began, TIMEOUT_CLASS, f"no result within {timeout_s:g}s; cancelled")
        except ServerCallError as exc:
            if exc.status is None and exc.error_class != TIMEOUT_CLASS:
                self.down.add(job.agent)
            return self._failed(job, began, exc.error_class, exc.detail)
        except Exception as exc:  # a bad reply must become a recorded failure, not an abort
            return self._failed(job, began, type(exc).__name__, str(exc))
        self.down.discard(job.agent)
        if (typed := typed_failure(rollout)) is not None:
            result = self._failed(job, began, *typed)
            assert result.failure is not None
            kept = (k for k in rollout if k.startswith(NG_FAILURE_PREFIX) or k in EPISODE_STAMPS)
            result.failure.update({k: rollout[k] for k in kept})
            return result
        rollout.update(carried(job.row))
        rollout[TASK_INDEX] = job.task_index
        rollout[ROLLOUT_INDEX] = job.rollout_index
        return Result(job, time.perf_counter() - began, rollout=rollout)


async def collect(
    jobs: Iterable[Job],
    client: ServerClient,
    limits: Limits | None = None,
    health: StackHealth | None = None,
    monitor: HealthMonitor | None = None,
    call: JobCall | None = None,
) -> AsyncGenerator[Result, None]:
    """Yield a Result for every job, in completion order; ``call`` runs one (default ``run_call``).

    Stopping the iteration early (``break``, or cancelling the consumer) cancels the rollouts in
    flight; the jobs not yielded are simply not done, which is what ``--resume`` relies on.
    Jobs of an agent that ``health`` knows a dead server of, or that ``monitor`` has quarantined,
    are recorded as failures at once instead of being sent.
    """
    limits = limits or Limits()
    runner = _Runner(call or run_call(client), limits, health, monitor)
    pending = iter(jobs)
    results: asyncio.Queue[Result | None] = asyncio.Queue(maxsize=max(16, limits.concurrency))

    async def worker() -> None:
        for job in pending:
            await results.put(await runner.run(job))

    crashed: list[BaseException] = []

    async def supervise(workers: list[asyncio.Future[None]]) -> None:
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
        crashed.extend(o for o in outcomes if isinstance(o, BaseException))
        await results.put(None)

    tasks = [asyncio.ensure_future(worker()) for _ in range(max(1, limits.concurrency))]
    tasks.append(asyncio.ensure_future(supervise(list(tasks))))
    try:
        while (result := await results.get()) is not None:
            yield result
        if crashed:
            raise crashed[0]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
