"""The numbers the overview and the compare page show, computed from a run's index.

This is the viewer's adapter to ``polygym.collect.statistics``, where every interval is made: it
turns a ``RunIndex`` into one value per task (a task's mean reward over its successful rollouts;
failed rows have no reward to average) and hands those over. Tasks are paired by their prompt
(``RunIndex.task_key``), so two runs over the same data pair up even when their task indices
differ: paired bootstrap over shared tasks, Welch when none is shared, a normal-approximation
interval for one run's mean. pass@k uses ``polygym.metrics``' estimator (the same as the run's
metrics file), the per-metric deltas of two metrics files come from ``polygym.collect.compare``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from polygym.collect import statistics as stats
from polygym.collect.statistics import Estimate
from polygym.collect.statistics import mean_interval as estimate
from polygym.metrics import k_values, pass_at_k
from polygym.row import ALL_ENVS, PASS_THRESHOLD
from polygym.view.index import RunIndex

__all__ = ["Estimate", "estimate"]


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


def _rewards(index: RunIndex, groups: dict[str, list[int]]) -> dict[str, list[float]]:
    return {key: [index.reward[i] for i in members] for key, members in groups.items()}


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


def compare_envs(base: RunIndex, new: RunIndex) -> list[EnvDelta]:
    base_rows, new_rows = env_rows(base), env_rows(new)
    envs = [e for e in base_rows if e != ALL_ENVS] + [e for e in new_rows if e not in base_rows]
    out = []
    for env in [*envs, ALL_ENVS]:
        a = task_means(base, base_rows.get(env, []))
        b = task_means(new, new_rows.get(env, []))
        d = stats.delta(a, b)
        paired = len(a.keys() & b.keys())
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
    found = stats.flips(_rewards(base, a), _rewards(new, b))
    out = [
        Flip(base.envs[base.env[a[key][0]]], key, a[key], b[key], now_solved)
        for keys, now_solved in ((found.lost, False), (found.gained, True))
        for key in keys
    ]
    out.sort(key=lambda f: (f.now_solved, f.env, f.base_rows[0]))
    return out
