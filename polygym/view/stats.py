"""The numbers the overview and the compare page show: ``gym eval compare``'s own, from a run's index.

The viewer computes nothing of its own kind. It reads each environment's scored rollouts from the
index as ``polygym.collect.compare`` reads a rollouts file (rewards by environment and task, the
task being ``task_identity``: ``_ng_task_index``; failed and masked rows carry no reward) and
hands them to that module: ``task_summary`` for one run's numbers, ``compare_runs`` for two. So
a page shows what the metrics file and ``gym eval compare`` say on the same files
(``tests/view/test_same_numbers.py`` holds them equal).

What each aggregate averages is part of its name on the page:

* an environment's **mean reward** is the mean over its scored rollouts, with an interval over
  tasks (``rollout_mean_interval``: a task's repeats are correlated); its **pass@k** are means
  **over its tasks** (each task's estimate from its repeats), as in the metrics file;
* the **(all)** row's reward and pass@k are the **mean of the environments' values**, each
  environment counting once (``gym eval compare``'s roll-up), with a stratified normal interval;
  its counts are sums and its tokens and turns means over all scored rollouts.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from polygym.collect import statistics as stats
from polygym.collect.compare import REWARD, Comparison, EnvRun, TaskId, Tasks, compare_runs, task_summary
from polygym.collect.statistics import Estimate
from polygym.row import ALL_ENVS
from polygym.view.index import RunIndex

__all__ = ["REWARD", "Comparison", "EnvSummary", "Flip"]


def env_tasks(index: RunIndex) -> dict[str, Tasks]:
    """Each environment's scored rewards by task, in file order (as ``read_rollouts`` reads them)."""
    n = len(index)
    out: dict[str, Tasks] = {env: {} for env in index.envs}
    tasks, envs = index.tasks, index.envs
    for failed, masked, code, value in zip(
        index.failed[:n], index.masked[:n], index.task_code[:n], index.reward[:n], strict=True
    ):
        if not (failed or masked):
            env, identity = tasks[code]
            out[envs[env]].setdefault(identity, []).append(value)
    return {env: found for env, found in out.items() if found}


@dataclass
class EnvSummary:
    env: str
    rollouts: int
    """Scored rollouts (neither failed nor masked)."""
    failures: int
    failures_by_class: dict[str, int]
    masked: int
    tasks: int
    reward: Estimate
    pass_at: dict[str, float]
    tokens_mean: float | None
    tokens_total: int
    turns_mean: float | None
    latency: dict[str, float | None] = field(default_factory=dict)
    """p50/p90/p99 seconds, from the run's metrics file (rollout rows do not carry their latency;
    percentiles of several environments cannot be combined, so the roll-up has none)."""


def _usage(index: RunIndex, rows: list[int]) -> tuple[float | None, int, float | None]:
    ok = [i for i in rows if not index.failed[i]]
    tokens = [index.tokens[i] for i in ok]
    turns = [index.turns[i] for i in ok]
    return (statistics.fmean(tokens) if ok else None, sum(tokens), statistics.fmean(turns) if ok else None)


def rows_by_env(index: RunIndex) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {env: [] for env in index.envs}
    envs = index.envs
    for i, code in enumerate(index.env[: len(index)]):
        out[envs[code]].append(i)
    return out


def summarize(
    index: RunIndex, env: str, rows: list[int], tasks: Tasks, latency: dict[str, float] | None
) -> EnvSummary:
    failed = [i for i in rows if index.failed[i]]
    summary = task_summary(tasks) if tasks else {}
    tokens_mean, tokens_total, turns_mean = _usage(index, rows)
    interval = stats.rollout_mean_interval(list(tasks.values()))
    return EnvSummary(
        env=env,
        rollouts=sum(len(r) for r in tasks.values()),
        failures=len(failed),
        failures_by_class=dict(Counter(index.classes[index.failure_class[i]] for i in failed).most_common()),
        masked=sum(index.masked[i] for i in rows),
        tasks=len(tasks),
        reward=interval,
        pass_at={k: v for k, v in summary.items() if k.startswith("pass@")},
        tokens_mean=tokens_mean,
        tokens_total=tokens_total,
        turns_mean=turns_mean,
        latency=dict(latency or {}),
    )


def mean_of_environments(estimates: list[Estimate], confidence: float = stats.DEFAULT_CONFIDENCE) -> Estimate:
    """The mean of environments' means, each counting once; its interval adds their variances
    (independent strata), recovered from each normal interval's width, and stays within the
    environments' own intervals (which are cut to the range of their values)."""
    found = [e for e in estimates if e.mean is not None]
    if not found:
        return stats.NOTHING
    mean = statistics.fmean(e.mean for e in found if e.mean is not None)
    if any(e.low is None or e.high is None for e in found):
        return Estimate(mean, None, None, sum(e.n for e in found))
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    variance = sum(((e.high or 0.0) - (e.low or 0.0)) ** 2 / (2 * z) ** 2 for e in found)
    half = z * math.sqrt(variance) / len(found)
    low = max(mean - half, min(e.low or 0.0 for e in found))  # a mean of means stays within theirs
    high = min(mean + half, max(e.high or 0.0 for e in found))
    return Estimate(mean, low, high, sum(e.n for e in found), stats.NORMAL)


def rollup(index: RunIndex, summaries: list[EnvSummary]) -> EnvSummary:
    """The (all) row: counts summed, reward and pass@k the mean of the environments' values."""
    keys = set.intersection(*(set(s.pass_at) for s in summaries)) if summaries else set()
    tokens_mean, tokens_total, turns_mean = _usage(index, list(range(len(index))))
    failures = Counter[str]()
    for s in summaries:
        failures.update(s.failures_by_class)
    return EnvSummary(
        env=ALL_ENVS,
        rollouts=sum(s.rollouts for s in summaries),
        failures=sum(s.failures for s in summaries),
        failures_by_class=dict(failures.most_common()),
        masked=sum(s.masked for s in summaries),
        tasks=sum(s.tasks for s in summaries),
        reward=mean_of_environments([s.reward for s in summaries]),
        pass_at={k: statistics.fmean(s.pass_at[k] for s in summaries) for k in keys},
        tokens_mean=tokens_mean,
        tokens_total=tokens_total,
        turns_mean=turns_mean,
    )


def env_runs(index: RunIndex) -> dict[str, EnvRun]:
    """The run as ``compare_runs`` takes it: every environment's task summary and tasks."""
    runs = {env: EnvRun({}, tasks) for env, tasks in env_tasks(index).items()}
    for run in runs.values():
        run.metrics = task_summary(run.tasks or {}, run.values())
    return runs


def compare_indexes(base: RunIndex, new: RunIndex) -> Comparison:
    """``gym eval compare`` of the two indexed runs (default metrics, threshold and seed)."""
    return compare_runs(base.source.name, env_runs(base), [(new.source.name, env_runs(new))])


@dataclass(frozen=True)
class Flip:
    env: str
    task: TaskId
    key: str
    """``task_key``: the side-by-side page's address."""
    base_rows: list[int]
    new_rows: list[int]
    now_solved: bool
    """True: unsolved in base, solved in new; False: the other way."""


def task_rows(index: RunIndex, tasks: set[tuple[str, TaskId]]) -> dict[tuple[str, TaskId], list[int]]:
    """The rows of each of ``tasks`` ((environment, task) pairs), in file order."""
    wanted: dict[int, tuple[str, TaskId]] = {}
    for code, (env, identity) in enumerate(index.tasks):
        if (index.envs[env], identity) in tasks:
            wanted[code] = (index.envs[env], identity)
    out: dict[tuple[str, TaskId], list[int]] = {task: [] for task in tasks}
    for i, code in enumerate(index.task_code[: len(index)]):
        if code in wanted:
            out[wanted[code]].append(i)
    return out


def flips(base: RunIndex, new: RunIndex, comparison: Comparison) -> list[Flip]:
    """The tasks ``comparison`` found flipped, with their rows in each run, losses first."""
    flipped = {
        (env.env, task) for env in comparison.candidates[0].environments for task in (*env.lost, *env.gained)
    }
    a, b = task_rows(base, flipped), task_rows(new, flipped)
    out = []
    for env in comparison.candidates[0].environments:
        for tasks, now_solved in ((env.lost, False), (env.gained, True)):
            for task in tasks:
                rows = a.get((env.env, task), [])
                key = base.task_key_of(rows[0]) if rows else ""
                out.append(Flip(env.env, task, key, rows, b.get((env.env, task), []), now_solved))
    out.sort(key=lambda f: (f.now_solved, f.env, f.base_rows[:1]))
    return out
