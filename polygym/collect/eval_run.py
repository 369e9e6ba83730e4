"""One ``gym eval run``: jobs in, files out, a summary at the end — shared by the CLI and tests.

The run is interruptible at any point: results are written as they arrive, so cancelling the task
(Ctrl-C) leaves exactly the finished rollouts on disk and ``--resume`` picks up the rest.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from polygym import metrics
from polygym.collect.health import Finding, HealthMonitor, env_of
from polygym.collect.job_plan import JobPlan
from polygym.collect.progress import Progress
from polygym.collect.rollouts import Limits, Result, collect, run_call
from polygym.collect.run_files import RolloutWriter, RunFiles, finished_keys, prepare
from polygym.collect.run_lock import RunLock
from polygym.collect.run_stack import check_stack, read_identity
from polygym.collect.stack_watch import StackHealth
from polygym.jsonl import JsonlAppender, count_rows, iter_jsonl
from polygym.kinds import AGENT_KIND
from polygym.net.client import ServerCallError, ServerClient
from polygym.row import ATTEMPT_INDEX, ENVIRONMENT_SERVER, NG_PERF, ROLLOUT_INDEX, TASK_INDEX, Job

REDUCED_SCALARS = (str, int, float, bool, type(None))


@dataclass
class RunSummary:
    total: int
    skipped: int
    succeeded: int = 0
    failed: int = 0
    failures_by_class: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, array[float]] = field(default_factory=lambda: defaultdict(lambda: array("d")))
    """Seconds per finished rollout, per agent: 8 bytes each in an array, where a list of floats
    kept 33 (a run of a million rollouts keeps 8 MB for its exact latency percentiles)."""
    interrupted: bool = False
    health: HealthMonitor = field(
        default_factory=lambda: HealthMonitor(quarantine_rate=1.0, keep_findings=False)
    )
    """Rates and quarantine decisions of this run's rollouts (quarantines nothing by default); its
    findings are counted, not listed: ``write_aggregate_metrics`` and ``gym eval health-check``
    find them again in the files."""

    @property
    def missing(self) -> int:
        return self.total - self.skipped - self.succeeded


def reduce_rollout(rollout: dict[str, Any]) -> dict[str, Any]:
    """What ``/aggregate_metrics`` needs of a rollout: scalar fields, token usage and ``ng_perf``.

    Full responses can be megabytes each; metrics over 10,000 rollouts must not resend them.
    """
    reduced: dict[str, Any] = {k: v for k, v in rollout.items() if isinstance(v, REDUCED_SCALARS)}
    response = rollout.get("response")
    if isinstance(response, dict):
        reduced["response"] = {"usage": response.get("usage"), "status": response.get("status")}
    if isinstance(perf := rollout.get(NG_PERF), dict):
        reduced[NG_PERF] = perf  # NeMo Gym's /aggregate_metrics summarises it as perf_summary
    return reduced


class MetricsInputs:
    """Per agent, what ``/aggregate_metrics`` will receive, kept as the rollouts arrive.

    Each rollout is reduced (``reduce_rollout``) and its JSON appended to the agent's spool, a
    temporary file past 1 MiB, so that after the window the metrics need neither a second
    pass over the output file (parsing every full rollout again) nor a list of every rollout's
    dict in memory: each agent's request body is its spool's bytes, sent as they are.
    """

    SPOOL_IN_MEMORY = 1 << 20
    """Bytes of one agent's spool kept in memory (~6,500 reduced rollouts) before it moves to disk:
    a run over a hundred environments holds at most ~100 MiB of them."""

    def __init__(self) -> None:
        self._spools: dict[str, IO[bytes]] = {}
        self._files = ExitStack()
        self.rollouts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.environment_servers: set[str] = set()
        """The keys that are environment servers (episodes), not agents."""

    def rollout(self, agent: str, rollout: dict[str, Any]) -> None:
        if ENVIRONMENT_SERVER in rollout:
            self.environment_servers.add(agent)
        spool = self._spools.get(agent)
        if spool is None:
            spool = tempfile.SpooledTemporaryFile(self.SPOOL_IN_MEMORY)  # noqa: SIM115 (closed by close)
            self._files.callback(spool.close)
            self._spools[agent] = spool
            spool.write(b"[")
        else:
            spool.write(b",")
        spool.write(orjson.dumps(reduce_rollout(rollout)))
        self.rollouts[agent] += 1

    def failure(self, agent: str, failure: dict[str, Any]) -> None:
        if ENVIRONMENT_SERVER in failure:
            self.environment_servers.add(agent)
        self.failures[agent] += 1

    def agents(self) -> list[str]:
        return sorted(set(self.rollouts) | set(self.failures))

    def body(self, agent: str) -> bytes:
        """The agent's reduced rollouts as one JSON array (``[]`` for none)."""
        spool = self._spools.get(agent)
        if spool is None:
            return b"[]"
        spool.seek(0)
        return spool.read() + b"]"

    def close(self) -> None:
        self._files.close()
        self._spools.clear()

    @classmethod
    def from_files(cls, files: RunFiles, health: HealthMonitor) -> MetricsInputs:
        """Read back from a run's files (a resumed run's earlier rows, re-verification), one row
        at a time; ``health`` observes every row on the way."""
        inputs = cls()
        for rollout in iter_jsonl(files.output):
            inputs.rollout(env_of(rollout), rollout)
            health.observe(rollout)
        for failure in iter_jsonl(files.failures):
            inputs.failure(env_of(failure), failure)
            health.observe_failure(failure)
        return inputs


def latency_metrics(latencies: Iterable[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {}
    out = {"latency/mean_s": statistics.fmean(ordered)}
    for pct in (50, 90, 95, 99):
        out[f"latency/p{pct}_s"] = ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]
    return out


METRICS_FALLBACK = "metrics_fallback"
"""Key of an entry whose environment gave no metrics: why, and that polygym's generic ones stand in
(absent when the environment's own ``/aggregate_metrics`` answered)."""


async def _agent_metrics(client: ServerClient, agent: str, rollouts: bytes) -> dict[str, Any]:
    """The environment's own metrics when its agent answers, polygym's generic ones otherwise.

    The reduced rollouts (a JSON array, encoded once) go as ``verify_responses``, NeMo Gym's key:
    NeMo Gym's servers require it (422 without it) and polygym's accept it as well. A fallback is
    never silent: it prints a warning naming the agent and the error and marks the entry, since
    the environment's own metrics (its pass rates, judge scores, ...) are then missing from the file.
    """
    try:
        body = {"verify_responses": orjson.Fragment(rollouts)}
        reply = await client.call(agent, "/aggregate_metrics", body, timeout_s=120.0)
        data = reply.json()
        if isinstance(data, dict) and isinstance(data.get("agent_metrics"), dict):
            return data
        error = f"unexpected reply {str(data)[:200]!r}"
    except ServerCallError as exc:
        error = str(exc)
    print(
        f"warning: {agent}: /aggregate_metrics failed ({error}); wrote polygym's generic metrics instead",
        file=sys.stderr,
    )
    fallback = metrics.aggregate(orjson.loads(rollouts))
    return {**fallback, METRICS_FALLBACK: {"metrics": "polygym_generic", "error": error}}


async def write_aggregate_metrics(
    files: RunFiles, client: ServerClient, summary: RunSummary, live: MetricsInputs | None = None
) -> list[dict[str, Any]]:
    """Per-agent metrics over every rollout in the output (this run's and resumed ones).

    ``live``: what this run kept as its rollouts arrived, when they are the whole output (no
    resumed rows); its health is then ``summary.health``'s, not found again in the files.
    """
    if live is None:
        health = HealthMonitor()  # over the whole output, resumed rows included
        inputs = MetricsInputs.from_files(files, health)
        health.finish()
        late: list[Finding] = []
    else:
        health, inputs, late = summary.health, live, summary.health.task_findings()
    entries = []
    try:
        for agent in inputs.agents():
            count, failed = inputs.rollouts[agent], inputs.failures[agent]
            block = metrics.aggregate([])
            if count:
                block = await _agent_metrics(client, agent, inputs.body(agent))
            block["agent_metrics"].setdefault("num_rollouts", count)  # NeMo Gym's lack it
            block["agent_metrics"]["num_failures"] = failed
            block["agent_metrics"].update(latency_metrics(summary.latencies.get(agent, ())))
            block["agent_metrics"].update(health.metrics(agent, late))
            block["key_metrics"]["num_failures"] = failed
            entry = {"agent_ref": {"type": AGENT_KIND, "name": agent}, **block}
            if agent in inputs.environment_servers:  # NeMo Gym 0.7 names the server of each entry
                entry[ENVIRONMENT_SERVER] = agent
            entries.append(entry)
    finally:
        inputs.close()
    files.metrics.write_bytes(orjson.dumps(entries, option=orjson.OPT_INDENT_2))
    return entries


async def run_eval(
    client: ServerClient,
    jobs: JobPlan | Sequence[Job],
    files: RunFiles,
    limits: Limits,
    resume: bool = False,
    overwrite: bool = False,
    progress_interval_s: float = 10.0,
    allow_stack_change: bool = False,
    health: StackHealth | None = None,
    monitor: HealthMonitor | None = None,
    aggregate: bool = True,
) -> RunSummary:
    """Collect every job not yet done into ``files``; cancellation leaves a resumable run.

    The output is locked for the whole run (``RunLock``: a second run on it is refused), the stack
    is recorded and, on resume, checked against the recorded one (``run_stack``), and jobs are
    expanded one at a time: each is appended to the materialized inputs as it is dispatched, so
    neither memory nor that file grows before the rollouts do. ``monitor`` watches every result's
    health and quarantines an environment past its thresholds (``summary.health.quarantined``).
    ``aggregate=False`` writes no metrics file (NeMo Gym's ``--disable-aggregation``).
    """
    plan = jobs if isinstance(jobs, JobPlan) else JobPlan.from_jobs(jobs)
    with RunLock(files):
        failed = attempts(files) if resume else Counter()  # before prepare clears those run again
        prepare(files, resume, overwrite, fingerprint=plan.fingerprint())
        check_stack(files, await read_identity(client), allow_stack_change)
        done = {key for key in finished_keys(files) if plan.agent_of(key) is not None} if resume else set()
        summary = RunSummary(total=len(plan), skipped=len(done))
        if monitor is not None:
            summary.health = monitor
        already = Counter(plan.agent_of(key) or "?" for key in done)
        live = None if resume or not aggregate else MetricsInputs()
        with (
            RolloutWriter(files) as writer,
            JsonlAppender(files.materialized) as inputs,
            Progress(dict(plan.totals()), dict(already), progress_interval_s, summary.health) as progress,
        ):
            written = count_rows(files.materialized) if resume else 0
            todo = _dispatch(plan, done, inputs, written, failed)
            try:
                call = run_call(client, plan.result_types)
                async for result in collect(todo, client, limits, health, summary.health, call):
                    _record(result, writer, summary, live)
                    progress.update(result)
            except BaseException:
                summary.interrupted = True
                if live is not None:
                    live.close()
                raise
        if aggregate:
            await write_aggregate_metrics(files, client, summary, live)
    return summary


def attempts(files: RunFiles) -> Counter[tuple[int, int]]:
    """Failed attempts so far per rollout key: a resumed retry's ``_ng_attempt_index``. A resume
    clears the failures it runs again, so each failure counts itself plus the attempts before it
    (its own ``_ng_attempt_index``); NeMo Gym keeps one failure row per attempt instead."""
    failed: Counter[tuple[int, int]] = Counter()
    for f in iter_jsonl(files.failures):
        task, rollout, before = f.get(TASK_INDEX), f.get(ROLLOUT_INDEX), f.get(ATTEMPT_INDEX, 0)
        if isinstance(task, int) and isinstance(rollout, int) and isinstance(before, int):
            failed[task, rollout] = max(failed[task, rollout], before + 1)
    return failed


def _dispatch(
    plan: JobPlan,
    done: set[tuple[int, int]],
    inputs: JsonlAppender,
    written: int,
    failed: Counter[tuple[int, int]],
) -> Iterator[Job]:
    """The jobs still to run, in plan order; each job past the ``written`` already in the
    materialized inputs is appended there (as planned) as the collector takes it, and a retry of a
    rollout that ``failed`` before is sent with its ``ATTEMPT_INDEX``, as NeMo Gym 0.7 does."""
    for index, job in enumerate(plan):
        if index >= written:
            inputs.write(job.row)
        if job.key not in done:
            if failed[job.key]:
                job.row[ATTEMPT_INDEX] = failed[job.key]
            yield job


def _record(
    result: Result, writer: RolloutWriter, summary: RunSummary, live: MetricsInputs | None = None
) -> None:
    summary.latencies[result.job.agent].append(result.latency_s)
    if result.ok:
        assert result.rollout is not None
        writer.rollout(result.rollout)
        summary.health.observe(result.rollout)
        summary.succeeded += 1
        if live is not None:
            live.rollout(env_of(result.rollout), result.rollout)
    else:
        assert result.failure is not None
        writer.failure(result.failure)
        if live is not None:
            live.failure(env_of(result.failure), result.failure)
        summary.health.observe_failure(result.failure)
        summary.failed += 1
        summary.failures_by_class[result.failure["error_class"]] += 1
    summary.health.quarantine(result.job.agent)
