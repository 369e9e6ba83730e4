"""One ``gym eval run``: jobs in, files out, a summary at the end — shared by the CLI and tests.

The run is interruptible at any point: results are written as they arrive, so cancelling the task
(Ctrl-C) leaves exactly the finished rollouts on disk and ``--resume`` picks up the rest.
"""

from __future__ import annotations

import statistics
import sys
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from polygym import metrics
from polygym.collect.health import HealthMonitor
from polygym.collect.job_plan import JobPlan
from polygym.collect.progress import Progress
from polygym.collect.rollouts import Limits, Result, collect
from polygym.collect.run_files import RolloutWriter, RunFiles, done_keys, prepare
from polygym.collect.run_lock import RunLock
from polygym.collect.run_stack import check_stack, read_identity
from polygym.collect.stack_watch import StackHealth
from polygym.jsonl import JsonlAppender, count_rows, iter_jsonl
from polygym.net.client import ServerCallError, ServerClient
from polygym.protocol import AGENT_KIND
from polygym.row import ATTEMPT_INDEX, ROLLOUT_INDEX, TASK_INDEX, Job

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
    """What ``/aggregate_metrics`` needs of a rollout: scalar fields and token usage.

    Full responses can be megabytes each; metrics over 10,000 rollouts must not resend them.
    """
    reduced: dict[str, Any] = {k: v for k, v in rollout.items() if isinstance(v, REDUCED_SCALARS)}
    response = rollout.get("response")
    if isinstance(response, dict):
        reduced["response"] = {"usage": response.get("usage"), "status": response.get("status")}
    return reduced


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


async def _agent_metrics(client: ServerClient, agent: str, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
    """The environment's own metrics when its agent answers, polygym's generic ones otherwise.

    The rollouts go as ``verify_responses``, NeMo Gym's key: NeMo Gym's servers require it (422
    without it) and polygym's accept it as well. A fallback is never silent: it prints a warning
    naming the agent and the error and marks the entry, since the environment's own metrics
    (its pass rates, judge scores, ...) are then missing from the file.
    """
    try:
        body = {"verify_responses": rollouts}
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
    return {**metrics.aggregate(rollouts), METRICS_FALLBACK: {"metrics": "polygym_generic", "error": error}}


async def write_aggregate_metrics(
    files: RunFiles, client: ServerClient, summary: RunSummary
) -> list[dict[str, Any]]:
    """Per-agent metrics over every rollout in the output (this run's and resumed ones)."""
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    health = HealthMonitor()  # over the whole output, resumed rows included
    for rollout in iter_jsonl(files.output):
        by_agent[(rollout.get("agent_ref") or {}).get("name", "?")].append(reduce_rollout(rollout))
        health.observe(rollout)
    failures: Counter[str] = Counter()
    for failure in iter_jsonl(files.failures):
        failures[(failure.get("agent_ref") or {}).get("name", "?")] += 1
        health.observe_failure(failure)
    health.finish()
    entries = []
    for agent in sorted(set(by_agent) | set(failures)):
        block = (
            await _agent_metrics(client, agent, by_agent[agent]) if by_agent[agent] else metrics.aggregate([])
        )
        block["agent_metrics"].setdefault("num_rollouts", len(by_agent[agent]))  # NeMo Gym's lack it
        block["agent_metrics"]["num_failures"] = failures[agent]
        block["agent_metrics"].update(latency_metrics(summary.latencies.get(agent, ())))
        block["agent_metrics"].update(health.metrics(agent))
        block["key_metrics"]["num_failures"] = failures[agent]
        entries.append({"agent_ref": {"type": AGENT_KIND, "name": agent}, **block})
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
        failed = attempts(files) if resume else Counter()  # before prepare clears the failures
        prepare(files, resume, overwrite, fingerprint=plan.fingerprint())
        check_stack(files, await read_identity(client), allow_stack_change)
        done = {key for key in done_keys(files.output) if plan.agent_of(key) is not None} if resume else set()
        summary = RunSummary(total=len(plan), skipped=len(done))
        if monitor is not None:
            summary.health = monitor
        already = Counter(plan.agent_of(key) or "?" for key in done)
        with (
            RolloutWriter(files) as writer,
            JsonlAppender(files.materialized) as inputs,
            Progress(dict(plan.totals()), dict(already), progress_interval_s, summary.health) as progress,
        ):
            written = count_rows(files.materialized) if resume else 0
            todo = _dispatch(plan, done, inputs, written, failed)
            try:
                async for result in collect(todo, client, limits, health, summary.health):
                    _record(result, writer, summary)
                    progress.update(result)
            except BaseException:
                summary.interrupted = True
                raise
        if aggregate:
            await write_aggregate_metrics(files, client, summary)
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


def _record(result: Result, writer: RolloutWriter, summary: RunSummary) -> None:
    summary.latencies[result.job.agent].append(result.latency_s)
    if result.ok:
        assert result.rollout is not None
        writer.rollout(result.rollout)
        summary.health.observe(result.rollout)
        summary.succeeded += 1
    else:
        assert result.failure is not None
        writer.failure(result.failure)
        summary.health.observe_failure(result.failure)
        summary.failed += 1
        summary.failures_by_class[result.failure["error_class"]] += 1
    summary.health.quarantine(result.job.agent)
