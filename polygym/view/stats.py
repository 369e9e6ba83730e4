"""The numbers the overview and the compare page show, computed from a run's index.

**Confidence intervals are over tasks, not rollouts.** The repeats of one task are correlated (an
easy task passes every time), so treating 8 repeats of 50 tasks as 400 independent samples would
make an interval far too narrow. Each task's mean reward is one sample; the interval is the normal
approximation mean +/- 1.96 standard errors of those task means (none below two tasks), cut to
the range of the task means, which the mean can never leave.

**Comparing two runs** pairs tasks by their prompt (``RunIndex.task_key``): where both runs have
tasks in common the delta is the mean of the per-task differences and its interval comes from
their spread (paired, much tighter when both runs share the tasks' difficulty); otherwise it is the
difference of the two means with both standard errors combined. A task is *solved* when at least
half of its rollouts pass (reward >= ``PASS_THRESHOLD``); a *flip* is a paired task that is solved
in one run and not the other. pass@k uses ``polygym.metrics``' estimator (the same as the run's metrics
file), the per-metric deltas of two metrics files from ``polygym.collect.compare``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from polygym.metrics import k_values, pass_at_k
from polygym.row import ALL_ENVS, PASS_THRESHOLD
from polygym.view.index import RunIndex

Z95 = 1.959964


@dataclass(frozen=True)
class Estimate:
    mean: float | None
    low: float | None
    high: float | None
    n: int
    """Samples (tasks) behind it."""


def _half_width(values: Sequence[float]) -> float:
    """1.96 standard errors of the mean of ``values`` (at least two)."""
    return Z95 * statistics.stdev(values) / math.sqrt(len(values))


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and 95% interval (normal approximation) of independent samples."""
    if not values:
        return Estimate(None, None, None, 0)
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, None, len(values))
    half = _half_width(values)
    # A mean never leaves the range of what it averages: rewards in [0, 1] get no interval past 1.
    return Estimate(mean, max(min(values), mean - half), min(max(values), mean + half), len(values))


def env_rows(index: RunIndex) -> dict[str, list[int]]:
    """Row numbers by environment, plus every row under ``ALL_ENVS``."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, code in enumerate(index.env):
        out[index.envs[code]].append(i)
    out[ALL_ENVS] = list(range(len(index)))
    return out


def task_groups(index: RunIndex, rows: Sequence[int]) -> dict[str, list[int]]:
    """The successful rows of each task (failed rows have no reward to average)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i in rows:
        if not index.failed[i]:
            groups[index.task_key[i]].append(i)
    return groups


def task_means(index: RunIndex, rows: Sequence[int]) -> dict[str, float]:
    reward = index.reward
    return {
        key: sum(reward[i] for i in members) / len(members)
        for key, members in task_groups(index, rows).items()
    }


def solved(index: RunIndex, members: Sequence[int]) -> bool:
    return sum(index.reward[i] >= PASS_THRESHOLD for i in members) * 2 >= len(members)


def pass_rates(index: RunIndex, groups: dict[str, list[int]]) -> dict[str, float]:
    """pass@k and pass@1[avg-of-k] averaged over tasks, as ``polygym.metrics.group_metrics`` reports
    them (its estimator and its k values), from each task's counts: no row dicts for 100,000 rows."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for members in groups.values():
        n = len(members)
        c = sum(index.reward[i] >= PASS_THRESHOLD for i in members)
        for k in k_values(n):
            sums[f"pass@{k}"] += pass_at_k(n, c, k)
            counts[f"pass@{k}"] += 1
        sums["pass@1[avg-of-k]"] += c / n
        counts["pass@1[avg-of-k]"] += 1
    return {key: sums[key] / len(groups) for key in sums if counts[key] == len(groups)}


@dataclass
class EnvSummary:
    env: str
    rollouts: int
    failures: int
    failures_by_class: dict[str, int]
    reward: Estimate
    pass_at: dict[str, float]
    tokens_mean: float | None
    tokens_total: int
    turns_mean: float | None
    latency: dict[str, float | None] = field(default_factory=dict)
    """p50/p90/p99 seconds, from the run's metrics file (rollout rows do not carry their latency;
    percentiles of several environments cannot be combined, so the roll-up has none)."""


def summarize(index: RunIndex, env: str, rows: Sequence[int], latency: dict[str, float] | None) -> EnvSummary:
    ok = [i for i in rows if not index.failed[i]]
    failed = [i for i in rows if index.failed[i]]
    classes = Counter(index.classes[index.failure_class[i]] for i in failed)
    pass_at = pass_rates(index, task_groups(index, rows))
    return EnvSummary(
        env=env,
        rollouts=len(ok),
        failures=len(failed),
        failures_by_class=dict(classes.most_common()),
        reward=estimate(list(task_means(index, rows).values())),
        pass_at={k: v for k, v in pass_at.items() if k.startswith("pass@")},
        tokens_mean=statistics.fmean(index.tokens[i] for i in ok) if ok else None,
        tokens_total=sum(index.tokens[i] for i in ok),
        turns_mean=statistics.fmean(index.turns[i] for i in ok) if ok else None,
        latency=dict(latency or {}),
    )


@dataclass(frozen=True)
class EnvDelta:
    env: str
    base: Estimate
    new: Estimate
    delta: Estimate
    paired: int
    """Tasks in both runs (0: the delta is unpaired)."""


def delta(base: dict[str, float], new: dict[str, float]) -> tuple[Estimate, int]:
    """The new-minus-base mean reward with its interval: paired over shared tasks when there are any."""
    shared = sorted(set(base) & set(new))
    if shared:
        return estimate([new[k] - base[k] for k in shared]), len(shared)
    a, b = estimate(list(base.values())), estimate(list(new.values()))
    if a.mean is None or b.mean is None:
        return Estimate(None, None, None, 0), 0
    if a.n < 2 or b.n < 2:
        return Estimate(b.mean - a.mean, None, None, min(a.n, b.n)), 0
    half = math.hypot(_half_width(list(base.values())), _half_width(list(new.values())))
    diff = b.mean - a.mean
    return Estimate(diff, diff - half, diff + half, min(a.n, b.n)), 0


def compare_envs(base: RunIndex, new: RunIndex) -> list[EnvDelta]:
    base_rows, new_rows = env_rows(base), env_rows(new)
    envs = [e for e in base_rows if e != ALL_ENVS] + [e for e in new_rows if e not in base_rows]
    out = []
    for env in [*envs, ALL_ENVS]:
        a = task_means(base, base_rows.get(env, []))
        b = task_means(new, new_rows.get(env, []))
        d, paired = delta(a, b)
        out.append(EnvDelta(env, estimate(list(a.values())), estimate(list(b.values())), d, paired))
    return out


@dataclass(frozen=True)
class Flip:
    env: str
    task: str
    base_rows: list[int]
    new_rows: list[int]
    now_solved: bool
    """True: unsolved in base, solved in new; False: the other way."""


def flips(base: RunIndex, new: RunIndex) -> list[Flip]:
    """Tasks in both runs whose solved state differs, losses first (they are what to look at)."""
    a, b = task_groups(base, range(len(base))), task_groups(new, range(len(new)))
    out = []
    for key in a.keys() & b.keys():
        was, now = solved(base, a[key]), solved(new, b[key])
        if was != now:
            env = base.envs[base.env[a[key][0]]]
            out.append(Flip(env, key, a[key], b[key], now))
    out.sort(key=lambda f: (f.now_solved, f.env, f.base_rows[0]))
    return out
