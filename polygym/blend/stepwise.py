"""Step-wise collection: rollouts for training steps in sampler order, with per-step metrics.

Each step holds the planned number of prompts of every environment; each prompt is collected
``responses_per_prompt`` times (one task, rollouts 0..R-1). Task indices are global and stable:
prompt ``i`` of step ``s`` is task ``s * prompts_per_step + i``, so a run resumed at step N writes
the same indices an uninterrupted run would have. (With dynamic sampling a step owns more indices,
for its extra prompts: ``s * stride + i``, see ``dynamic_sampling``; a step's report then covers
the groups it trains, the files every group collected.)

Two rules keep one environment from hurting the others:

- Every environment of a step is collected by its own ``collect`` with its own share of the
  concurrency (at least one slot), so a slow environment holds only its own slots and cannot
  starve the others' quota.
- A step deadline (``step_timeout_s``): rollouts unfinished by then are cancelled, written to the
  failures file with ``error_class: "Straggler"``, and counted as stragglers of their environment;
  the step then ends with what finished. Without a deadline a step waits for every rollout (each
  still bounded by ``Limits.timeout_s``).

Files for ``output = X.jsonl`` (next to each other, like ``gym eval run``): ``X.jsonl`` rollouts
(each with ``_pg_step`` and ``_pg_env``), ``X_materialized_inputs.jsonl`` the jobs as sent,
``X_failures.jsonl`` failures and stragglers, ``X_steps.jsonl`` one line per step and environment
plus an ``_all`` roll-up, ``X_aggregate_metrics.json`` per-agent metrics at the end.

The ``realized_share`` of a step line is the environment's share of the step's *finished*
rollouts: it equals the planned share when nothing failed or straggled, and shows by how much
the batch a trainer receives was skewed when something did.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from polygym.blend.dynamic_sampling import DynamicSampling, EnvDraws, Refill, task_stride, total_draws
from polygym.blend.mix import Blend, load_blend
from polygym.blend.planner import Plan
from polygym.blend.sampler import Step, StepItem, StepSampler
from polygym.blend.spec import BlendSpec
from polygym.collect.eval_run import RunSummary, write_aggregate_metrics
from polygym.collect.rollouts import Limits, Result, collect, failure_record
from polygym.collect.run_files import RolloutWriter, RunFileError, RunFiles, prepare
from polygym.collect.run_lock import RunLock
from polygym.jsonl import JsonlAppender, iter_jsonl, write_jsonl
from polygym.net.client import ServerClient
from polygym.row import (
    ALL_ENVS,
    ENV_FIELD,
    PASS_THRESHOLD,
    ROLLOUT_INDEX,
    STEP_FIELD,
    TASK_INDEX,
    Job,
    make_job,
    reward,
    total_tokens,
)
from polygym.stack.environment import EnvironmentNotFoundError, config_file

STRAGGLER = "Straggler"


@dataclass(frozen=True)
class StepSettings:
    """How steps are collected, for ``gym eval run --blend`` and trainers alike.

    The blend spec fixes *what* each step holds; these settings fix how it is sent. Together they
    determine every job, so a run continued at a step checks them against what was written.
    """

    steps: int
    """Steps to collect."""
    start_step: int = 0
    """First step; > 0 continues a run in the same files (records of later steps are dropped)."""
    limits: Limits = field(default_factory=Limits)
    """Concurrency (shared out per environment; per-agent caps apply) and the per-rollout timeout."""
    step_timeout_s: float | None = None
    """Step deadline; rollouts unfinished by then are recorded as stragglers (None: no deadline)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Fields set in every request (``temperature``, ``max_output_tokens``...)."""
    seed: int | None = None
    """Request seed: response ``r`` of a prompt is sent with ``seed + r`` (None: the row's own)."""
    dynamic_sampling: DynamicSampling | None = None
    """Replace groups without reward variance from the same environment (``dynamic_sampling``)."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.start_step < 0:
            raise ValueError("steps and start_step must be >= 0")

    def jobs(self, step: Step, plan: Plan) -> dict[str, list[Job]]:
        return step_jobs(step, plan, self.sampling, self.seed, self.task_stride(plan))

    def task_stride(self, plan: Plan) -> int:
        return task_stride(plan, self.dynamic_sampling)

    def item_jobs(self, item: StepItem, task: int, plan: Plan) -> list[Job]:
        """The ``responses_per_prompt`` jobs of one prompt as task ``task``."""
        return prompt_jobs(item, task, plan, self.sampling, self.seed)


@dataclass(frozen=True)
class StepFiles(RunFiles):
    """``RunFiles`` plus ``X_steps.jsonl``."""

    @property
    def steps(self) -> Path:
        return self._sibling("_steps.jsonl")

    def all(self) -> list[Path]:
        return [*super().all(), self.steps]


@dataclass
class EnvStepReport:
    """One environment in one step (also the ``_all`` roll-up)."""

    step: int
    env: str
    agent: str | None
    target_share: float
    planned_share: float
    realized_share: float
    prompts: int
    rollouts: int
    """Rollouts planned (prompts x responses_per_prompt)."""
    completed: int
    failures: int
    stragglers: int
    reward_mean: float | None
    reward_std: float | None
    pass_rate: float | None
    tokens: int
    latency_mean_s: float | None


@dataclass
class StepReport:
    step: int
    elapsed_s: float
    timed_out: bool
    envs: dict[str, EnvStepReport]
    total: EnvStepReport
    rollouts: list[dict[str, Any]] = field(default_factory=list, repr=False)
    """This step's successful rollouts of its trained groups, for a trainer that consumes them directly."""
    slots: dict[int, int] = field(default_factory=dict)
    """Task index of each trained group -> its slot in the step (0 .. prompts_per_step - 1): the
    planned prompt it stands for. The identity unless dynamic sampling replaced a group."""
    dynamic: dict[str, EnvDraws] | None = None
    """Per environment, what dynamic sampling drew, saw and dropped (None: it was off)."""

    def env_extra(self, env: str) -> dict[str, Any]:
        """Fields of ``env``'s line beyond its report: the step's timing, dynamic sampling."""
        extra: dict[str, Any] = {"elapsed_s": round(self.elapsed_s, 4), "timed_out": self.timed_out}
        if self.dynamic is not None:
            draws = self.dynamic[env] if env in self.dynamic else total_draws(self.dynamic.values())
            extra["dynamic_sampling"] = draws.to_dict()
        return extra

    def lines(self) -> list[dict[str, Any]]:
        return [{**asdict(r), **self.env_extra(r.env)} for r in (*self.envs.values(), self.total)]


def _env_report(
    step: int,
    env: str,
    agent: str | None,
    shares: tuple[float, float],
    prompts: int,
    planned: int,
    results: list[Result],
    stragglers: int,
    finished_total: int,
) -> EnvStepReport:
    ok = [r.rollout for r in results if r.rollout is not None]
    rewards = [reward(r) for r in ok]
    return EnvStepReport(
        step=step,
        env=env,
        agent=agent,
        target_share=shares[0],
        planned_share=shares[1],
        realized_share=len(ok) / finished_total if finished_total else 0.0,
        prompts=prompts,
        rollouts=planned,
        completed=len(ok),
        failures=len(results) - len(ok),
        stragglers=stragglers,
        reward_mean=statistics.fmean(rewards) if rewards else None,
        reward_std=statistics.pstdev(rewards) if rewards else None,
        pass_rate=sum(r >= PASS_THRESHOLD for r in rewards) / len(rewards) if rewards else None,
        tokens=sum(total_tokens(r) for r in ok),
        latency_mean_s=statistics.fmean(r.latency_s for r in results) if results else None,
    )


def step_jobs(
    step: Step,
    plan: Plan,
    sampling: dict[str, Any] | None = None,
    seed: int | None = None,
    stride: int | None = None,
) -> dict[str, list[Job]]:
    """The jobs of one step by environment: each prompt times ``responses_per_prompt``
    (``sampling`` and ``seed`` as in ``make_job``; the step's tasks start at ``step x stride``,
    ``stride`` being ``prompts_per_step`` unless dynamic sampling reserves more)."""
    jobs: dict[str, list[Job]] = {env.name: [] for env in plan.environments}
    for i, item in enumerate(step.items):
        task = step.number * (stride or plan.prompts_per_step) + i
        jobs[item.env].extend(prompt_jobs(item, task, plan, sampling, seed))
    return jobs


def prompt_jobs(
    item: StepItem, task: int, plan: Plan, sampling: dict[str, Any] | None, seed: int | None
) -> list[Job]:
    """One prompt's jobs: task ``task``, responses ``0 .. responses_per_prompt - 1``."""
    agent = item.row["agent_ref"]["name"]
    return [make_job(item.row, agent, task, r, sampling, seed) for r in range(plan.responses_per_prompt)]


def _env_limits(limits: Limits, agent: str, share: int, total: int) -> Limits:
    """This environment's slice of the concurrency: proportional to its rollouts, at least 1."""
    slots = max(1, math.ceil(limits.concurrency * share / total)) if total else 1
    cap = limits.per_agent.get(agent)
    if cap is not None:
        slots = min(slots, cap)
    return Limits(concurrency=slots, per_agent={}, timeout_s=limits.timeout_s, retry=limits.retry)


async def _collect_step(
    client: ServerClient,
    jobs: dict[str, list[Job]],
    limits: Limits,
    deadline_s: float | None,
    on_result: Callable[[str, Result], None],
) -> bool:
    """Collect a step's jobs, one ``collect`` per environment; True when the deadline cut it."""
    total = sum(len(j) for j in jobs.values())

    async def run_env(env: str, env_jobs: list[Job]) -> None:
        env_limits = _env_limits(limits, env_jobs[0].agent, len(env_jobs), total)
        async with contextlib.aclosing(collect(env_jobs, client, env_limits)) as results:
            async for result in results:
                on_result(env, result)

    tasks = [asyncio.ensure_future(run_env(env, env_jobs)) for env, env_jobs in jobs.items() if env_jobs]
    try:
        if not tasks:
            return False
        _, pending = await asyncio.wait(tasks, timeout=deadline_s)
    finally:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
    return bool(pending)


def _step_of(record: dict[str, Any], stride: int) -> int | None:
    task = record.get(TASK_INDEX)
    return task // stride if isinstance(task, int) else None


def _keep_before(path: Path, start_step: int, step_of: Callable[[dict[str, Any]], int | None]) -> None:
    """Drop records of steps >= start_step (a partial step from an interrupted run)."""
    if not path.exists():
        path.write_bytes(b"")
        return
    kept = [r for r in iter_jsonl(path) if (s := step_of(r)) is not None and s < start_step]
    write_jsonl(kept, path)


def _keep_steps_before(files: StepFiles, start_step: int, stride: int) -> None:
    """What a run continued at ``start_step`` keeps: every record of the steps before it."""
    for path in (files.output, files.failures, files.materialized):
        _keep_before(path, start_step, lambda r: _step_of(r, stride))
    _keep_before(files.steps, start_step, lambda r: r.get("step") if isinstance(r.get("step"), int) else None)


def prepare_step_files(
    files: StepFiles, sampler: StepSampler, settings: StepSettings, overwrite: bool
) -> None:
    """Fresh files at step 0; at a later step, keep earlier steps and check they match the spec."""
    stride = settings.task_stride(sampler.plan)
    start_step = settings.start_step
    prepare(
        files,
        resume=start_step > 0,
        overwrite=overwrite,
        keep=lambda _: _keep_steps_before(files, start_step, stride),
        how_to_continue="pass a start step to continue that run",
    )
    if start_step == 0:
        return
    planned = range((start_step - 1) * stride, (start_step - 1) * stride + sampler.plan.prompts_per_step)
    previous = [r for r in iter_jsonl(files.materialized) if r.get(TASK_INDEX) in planned]
    if previous:
        expected = [
            job.row
            for env_jobs in settings.jobs(sampler.step(start_step - 1), sampler.plan).values()
            for job in env_jobs
        ]
        key = lambda r: (r[TASK_INDEX], r[ROLLOUT_INDEX])  # noqa: E731
        if sorted(previous, key=key) != sorted(expected, key=key):
            raise RunFileError(
                f"cannot continue at step {start_step}: step {start_step - 1} in {files.materialized} "
                "differs from what this spec gives (changed data, weights, step shape or seed); "
                "start over instead"
            )


class _StepRecorder:
    """Writes one step's results as they arrive and keeps what the step report needs."""

    def __init__(self, step: int, writer: RolloutWriter, summary: RunSummary | None) -> None:
        self.step = step
        self.writer = writer
        self.summary = summary or RunSummary(total=0, skipped=0)
        self.results: dict[str, list[Result]] = defaultdict(list)
        self.rollouts: list[dict[str, Any]] = []

    def record(self, env: str, result: Result) -> None:
        self.results[env].append(result)
        self.summary.latencies[result.job.agent].append(result.latency_s)
        if result.rollout is not None:
            result.rollout[STEP_FIELD] = self.step
            result.rollout[ENV_FIELD] = env
            self.writer.rollout(result.rollout)
            self.rollouts.append(result.rollout)
            self.summary.succeeded += 1
        elif result.failure is not None:
            self._failure(env, result.failure)

    def _failure(self, env: str, failure: dict[str, Any]) -> None:
        self.writer.failure({**failure, STEP_FIELD: self.step, ENV_FIELD: env})
        self.summary.failed += 1
        self.summary.failures_by_class[failure["error_class"]] += 1

    def stragglers(
        self, jobs: dict[str, list[Job]], deadline_s: float | None, elapsed: float
    ) -> dict[str, list[Job]]:
        """Record every job without a result as a straggler failure; those jobs by environment."""
        late: dict[str, list[Job]] = defaultdict(list)
        limit = f" of {deadline_s:g}s" if deadline_s is not None else ""
        message = f"not finished within the step deadline{limit}"
        for env, env_jobs in jobs.items():
            finished = {r.job.key for r in self.results[env]}
            for job in env_jobs:
                if job.key not in finished:
                    late[env].append(job)
                    self._failure(env, failure_record(job, STRAGGLER, message, elapsed))
        return late


async def stream_steps(
    client: ServerClient,
    blend: Blend,
    files: StepFiles,
    settings: StepSettings,
    summary: RunSummary | None = None,
) -> AsyncGenerator[StepReport, None]:
    """Collect steps ``start_step .. start_step + steps - 1``; yields each step's report as it ends.

    Files must have been prepared (``prepare_step_files``); every line is flushed as it is written.
    """
    deadline_s = settings.step_timeout_s
    plan = blend.plan()
    sampler = blend.sampler(plan)
    agents = {env.name: env.agent for env in blend.environments}
    with (
        RolloutWriter(files) as writer,
        JsonlAppender(files.materialized) as inputs,
        JsonlAppender(files.steps) as log,
    ):
        for step in sampler.steps(settings.start_step, settings.steps):
            jobs = settings.jobs(step, plan)
            recorder = _StepRecorder(step.number, writer, summary)
            began = time.perf_counter()
            refill = (
                Refill(step, plan, sampler, settings.dynamic_sampling, partial(settings.item_jobs, plan=plan))
                if settings.dynamic_sampling is not None
                else None
            )
            timed_out, sent = await _collect_rounds(
                client, jobs, settings, refill, recorder, inputs.write_all
            )
            elapsed = time.perf_counter() - began
            late = recorder.stragglers(sent, deadline_s, elapsed)
            draws = refill.finish(recorder.results) if refill is not None else None
            kept = refill.kept_groups() if refill is not None else _planned_slots(step, plan)
            report = _report(step, plan, agents, jobs, recorder, late, kept, elapsed, timed_out)
            report.dynamic = draws
            log.write_all(report.lines())
            yield report


async def _collect_rounds(
    client: ServerClient,
    jobs: dict[str, list[Job]],
    settings: StepSettings,
    refill: Refill | None,
    recorder: _StepRecorder,
    write_inputs: Callable[[Iterable[dict[str, Any]]], Any],
) -> tuple[bool, dict[str, list[Job]]]:
    """Collect a step's jobs, then dynamic sampling's rounds of extras (if on) until it is done or
    the step deadline passes; whether the deadline cut a round, and every job sent by environment."""
    began = time.perf_counter()
    deadline_s = settings.step_timeout_s
    sent = {env: list(env_jobs) for env, env_jobs in jobs.items()}
    round_jobs = jobs
    while True:
        write_inputs(j.row for env_jobs in round_jobs.values() for j in env_jobs)
        left = None if deadline_s is None else deadline_s - (time.perf_counter() - began)
        timed_out = await _collect_step(client, round_jobs, settings.limits, left, recorder.record)
        out_of_time = deadline_s is not None and time.perf_counter() - began >= deadline_s
        round_jobs = refill.next_round(recorder.results) if refill and not (timed_out or out_of_time) else {}
        if not round_jobs:
            return timed_out, sent
        for env, extra in round_jobs.items():
            sent[env].extend(extra)


def _planned_slots(step: Step, plan: Plan) -> dict[int, int]:
    first = step.number * plan.prompts_per_step
    return {first + i: i for i in range(len(step.items))}


def _report(
    step: Step,
    plan: Plan,
    agents: dict[str, str],
    jobs: dict[str, list[Job]],
    recorder: _StepRecorder,
    late: dict[str, list[Job]],
    slots: dict[int, int],
    elapsed: float,
    timed_out: bool,
) -> StepReport:
    """The step's report over its trained groups (``slots``): the planned ones, or those dynamic
    sampling kept."""
    results = {env: [r for r in rs if r.job.task_index in slots] for env, rs in recorder.results.items()}
    stragglers = Counter({env: sum(j.task_index in slots for j in js) for env, js in late.items()})
    rollouts = [r for r in recorder.rollouts if r.get(TASK_INDEX) in slots]
    finished = sum(1 for rs in results.values() for r in rs if r.ok)
    envs = {
        env.name: _env_report(
            step.number,
            env.name,
            agents[env.name],
            (env.target_share, env.planned_share),
            step.shares[env.name].prompts,
            len(jobs[env.name]),
            results.get(env.name, []),
            stragglers[env.name],
            finished,
        )
        for env in plan.environments
    }
    every = [r for rs in results.values() for r in rs]
    total = _env_report(
        step.number,
        ALL_ENVS,
        None,
        (1.0, 1.0),
        len(step.items),
        sum(len(j) for j in jobs.values()),
        every,
        sum(stragglers.values()),
        finished,
    )
    return StepReport(step.number, elapsed, timed_out, envs, total, rollouts, slots)


async def run_steps(
    client: ServerClient,
    spec: BlendSpec | Blend,
    output: Path,
    settings: StepSettings,
    overwrite: bool = False,
    on_step: Callable[[StepReport], None] | None = None,
) -> list[StepReport]:
    """Collect ``settings.steps`` training steps from ``settings.start_step`` into ``output`` (see
    the module doc), holding the output's ``RunLock`` throughout.

    ``start_step > 0`` continues a run: records of steps >= start_step are dropped from the files
    first (the partial step of an interrupted run), the rest is kept. Raises RunFileError when the
    files belong to another run, and blend/dataset errors when the spec or its data is bad.
    """
    blend = spec if isinstance(spec, Blend) else load_blend(spec)
    files = StepFiles(output)
    reports: list[StepReport] = []
    with RunLock(files):  # one run per output, as for gym eval run (a second is refused)
        prepare_step_files(files, blend.sampler(), settings, overwrite)
        summary = RunSummary(total=settings.steps * blend.spec.global_batch_size, skipped=0)
        async for report in stream_steps(client, blend, files, settings, summary):
            report.rollouts = []  # kept on disk; a long run must not hold every rollout in memory
            reports.append(report)
            if on_step is not None:
                on_step(report)
        await write_aggregate_metrics(files, client, summary)
    return reports


def environments_to_serve(spec: BlendSpec) -> list[str]:
    """Resources servers a stack needs for ``spec`` (those with a config; the rest must already be
    in the user's --config files)."""
    names = []
    for env in spec.environments:
        try:
            config_file(env.name)
        except EnvironmentNotFoundError:
            continue
        names.append(env.name)
    return names
