"""Aggregate metrics over verified rollouts, in NeMo Gym's ``_aggregate_metrics.json`` shape.

One entry per agent holds ``agent_metrics`` (every statistic), ``key_metrics`` (the few numbers a
person looks at first), ``group_level_metrics`` (one row per task) and ``repeat_level_metrics``
(one row per rollout index, when there are several: how much a whole pass over the data varies).
pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) over the n rollouts of each task, which
is what papers report; the naive "any of the first k" estimate is biased and depends on rollout order.

The statistics NeMo Gym also computes are computed as it does, so the two files agree on the same
rollouts: ``std/<field>`` is the *sample* standard deviation (n-1; 0 for one value), fields whose
name starts with ``_`` (indices, collector stamps) are not summarised, and a rollout whose verifier
set ``mask_sample`` (its reward measures a broken environment, not the policy) is left out of every
quality statistic and counted in ``coverage/*`` instead.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from polygym.row import NG_PERF, PASS_THRESHOLD, ROLLOUT_INDEX, TASK_INDEX, reward, usage


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased probability that at least one of k samples drawn from n (c correct) is correct."""
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """The k reported for groups of n: powers of two below n, and n itself."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    if n > 1:
        ks.append(n)
    return ks


MASK_SAMPLE = "mask_sample"
"""A verifier's flag (NeMo Gym's ``BaseVerifyResponse`` field): this reward is not a measurement."""


def numeric_fields(rollout: dict[str, Any]) -> dict[str, float]:
    """Top-level numeric verifier fields plus token usage, the values worth summarising; ``_``
    fields (``_ng_task_index``, ``_pg_step``...) are bookkeeping, and ``mask_sample`` a flag."""
    values = {
        key: float(value)
        for key, value in rollout.items()
        if not key.startswith("_")
        and key != MASK_SAMPLE
        and isinstance(value, int | float)
        and math.isfinite(value)
    }
    if "reward" in rollout:
        values["reward"] = reward(rollout)  # booleans and bad values read as everywhere else
    counts = usage(rollout)
    values.update({f"usage/{key}": count for key, count in counts.items()})
    values.update(counts)  # NeMo Gym lifts usage to the top level: its keys read ``mean/input_tokens``
    return values


def describe(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "median": statistics.median(values),
    }


def field_statistics(fields: list[dict[str, float]]) -> dict[str, float]:
    """``mean/<field>``, ``std/<field>``... for every numeric field seen in any rollout
    (``fields``: each rollout's ``numeric_fields``, found once for this and ``repeat_metrics``)."""
    by_field: dict[str, list[float]] = defaultdict(list)
    for values in fields:
        for key, value in values.items():
            by_field[key].append(value)
    out: dict[str, float] = {}
    for key in sorted(by_field):
        for stat, value in describe(by_field[key]).items():
            out[f"{stat}/{key}"] = value
    return out


def majority_correct(answers: list[tuple[Any, bool]]) -> float:
    """1.0 when the most common answer (ties: first seen) was a correct one."""
    counts = Counter(a for a, _ in answers if a is not None)
    if not counts:
        return 0.0
    top = counts.most_common(1)[0][0]
    return 1.0 if any(ok for a, ok in answers if a == top) else 0.0


def group_metrics(
    rollouts: list[dict[str, Any]], pass_threshold: float = PASS_THRESHOLD, answer_field: str | None = None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """pass@k, pass@1[avg-of-k] and majority@k over tasks, plus one summary row per task."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for rollout in rollouts:
        groups[rollout.get(TASK_INDEX)].append(rollout)
    sums: dict[str, list[float]] = defaultdict(list)
    rows = []
    for task, members in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0])):
        n = len(members)
        correct = [reward(r) >= pass_threshold for r in members]
        c = sum(correct)
        row: dict[str, Any] = {TASK_INDEX: task, "num_rollouts": n, "num_correct": c}
        row["mean/reward"] = statistics.fmean(reward(r) for r in members)
        for k in k_values(n):
            row[f"pass@{k}"] = pass_at_k(n, c, k)
        row["pass@1[avg-of-k]"] = c / n
        if answer_field is not None:
            answers = [(r.get(answer_field), ok) for r, ok in zip(members, correct, strict=True)]
            row[f"majority@{n}"] = majority_correct(answers)
        for key, value in row.items():
            if "@" in key:
                sums[key].append(value)
        rows.append(row)
    summary = {key: statistics.fmean(values) for key, values in sums.items() if len(values) == len(groups)}
    return summary, rows


def repeat_statistics(values: list[float]) -> dict[str, float]:
    """What NeMo Gym reports per repeat: sample std (n-1), its standard error and quartiles."""
    n = len(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": std,
        "sem": std / math.sqrt(n),
        "min": min(values),
        "max": max(values),
        "p25": percentile(values, 0.25),
        "p75": percentile(values, 0.75),
    }


def repeat_metrics(rollouts: list[dict[str, Any]], fields: list[dict[str, float]]) -> list[dict[str, Any]]:
    """One row per rollout index (repeat) over all tasks; none unless there are several repeats.

    Each repeat is one full pass over the data, so the spread of its ``mean/reward`` across
    repeats is the run-to-run noise a score comparison must beat. ``fields``: each rollout's
    ``numeric_fields``, in the same order.
    """
    by_repeat: dict[Any, list[tuple[dict[str, Any], dict[str, float]]]] = defaultdict(list)
    for rollout, values in zip(rollouts, fields, strict=True):
        by_repeat[rollout.get(ROLLOUT_INDEX, 0)].append((rollout, values))
    if len(by_repeat) < 2:
        return []
    all_tasks = len({r.get(TASK_INDEX, 0) for r in rollouts})
    rows = []
    for index, members in sorted(by_repeat.items(), key=lambda kv: str(kv[0])):
        present = len({r.get(TASK_INDEX, 0) for r, _ in members})
        row: dict[str, Any] = {
            ROLLOUT_INDEX: index,
            "sample_count": present,
            "missing_count": all_tasks - present,
        }
        by_field: dict[str, list[float]] = defaultdict(list)
        for _, values in members:
            for key, value in values.items():
                by_field[key].append(value)
        for key in sorted(by_field):
            row.update({f"{stat}/{key}": v for stat, v in repeat_statistics(by_field[key]).items()})
        rows.append(row)
    return rows


def coverage(rollouts: list[dict[str, Any]], measured: list[dict[str, Any]]) -> dict[str, int]:
    """How much of ``rollouts`` the quality statistics come from (NeMo Gym's ``coverage/*`` keys);
    empty when nothing was masked, so an unmasked run's metrics gain no keys."""
    masked = len(rollouts) - len(measured)
    if not masked:
        return {}
    measured_tasks = {r.get(TASK_INDEX, 0) for r in measured}
    return {
        "coverage/measured_rollouts": len(measured),
        "coverage/masked_rollouts": masked,
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len({r.get(TASK_INDEX, 0) for r in rollouts} - measured_tasks),
    }


PERF_TOKEN_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens")
"""``ng_perf`` token counts, each summarised as ``mean_``, ``median_`` and ``total_<field>``."""
PERF_TURN_STATS = ("mean", "median", "std", "min", "p90", "max")
PERF_LATENCY_STATS = ("p50", "p90", "p99", "mean")


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) with linear interpolation between the closest ranks (numpy's and
    pandas' default, which NeMo Gym uses); one value is its own every quantile."""
    ranked = sorted(values)
    position = q * (len(ranked) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ranked) - 1)
    return float(ranked[low] + (ranked[high] - ranked[low]) * (position - low))


def perf_stat(values: list[float], stat: str) -> float:
    """One statistic by NeMo Gym's name for it (``std`` is the population one there)."""
    named: dict[str, Any] = {
        "mean": statistics.fmean,
        "median": statistics.median,
        "total": sum,
        "std": statistics.pstdev,
        "min": min,
        "max": max,
    }
    return named[stat](values) if stat in named else percentile(values, int(stat[1:]) / 100)


def perf_summary(rollouts: list[dict[str, Any]]) -> dict[str, float] | None:
    """NeMo Gym 0.7's ``perf_summary`` of the rollouts' ``ng_perf`` records, under its key names:
    the share of rollouts with a record and with token counts, token means/medians/totals, turn
    statistics, completion tokens per turn and latency percentiles. A statistic whose field no
    record holds is left out; None when no rollout has a record (NeMo Gym writes null then)."""
    records = [r[NG_PERF] for r in rollouts if isinstance(r.get(NG_PERF), dict)]
    if not records:
        return None

    def values(key: str) -> list[float]:
        return [r[key] for r in records if isinstance(r.get(key), int | float)]

    counted = [r for r in records if isinstance(r.get("token_observability_coverage"), int | float)]
    summary = {
        "overall_observability_coverage": len(records) / len(rollouts),
        "token_observability_coverage": sum(r["token_observability_coverage"] > 0 for r in counted)
        / len(rollouts),
    }
    for name in PERF_TOKEN_FIELDS:
        if found := values(name):
            summary.update({f"{stat}_{name}": perf_stat(found, stat) for stat in ("mean", "median", "total")})
    if turns := values("num_turns"):
        summary.update({f"{stat}_num_turns": perf_stat(turns, stat) for stat in PERF_TURN_STATS})
    per_turn = [
        r["completion_tokens"] / r["num_turns"]
        for r in records
        if isinstance(r.get("completion_tokens"), int | float)
        and isinstance(r.get("num_turns"), int | float)
        and r["num_turns"] > 0
    ]
    if per_turn:
        summary.update({f"{stat}_tokens_per_turn": perf_stat(per_turn, stat) for stat in ("mean", "median")})
    if latency := values("total_latency_ms"):
        summary.update({f"total_latency_{stat}_ms": perf_stat(latency, stat) for stat in PERF_LATENCY_STATS})
    return summary


def aggregate(
    rollouts: list[dict[str, Any]], pass_threshold: float = PASS_THRESHOLD, answer_field: str | None = None
) -> dict[str, Any]:
    """The metrics block of one agent: ``agent_metrics``, ``key_metrics``, ``group_level_metrics``,
    ``repeat_level_metrics`` and ``perf_summary``.

    ``num_rollouts`` and ``num_repeats`` count every rollout that ran; the rest is computed from the
    rollouts not masked (``mask_sample``), and none of it when every one was, but ``perf_summary``,
    which, as in NeMo Gym, covers every rollout that ran.
    """
    measured = [r for r in rollouts if not r.get(MASK_SAMPLE)]
    counts = {"num_rollouts": len(rollouts), **coverage(rollouts, measured)}
    if not measured:
        return {
            "agent_metrics": dict(counts),
            "key_metrics": dict(counts),
            "group_level_metrics": [],
            "repeat_level_metrics": [],
            "perf_summary": perf_summary(rollouts),
        }
    agent_metrics: dict[str, Any] = {"num_rollouts": len(rollouts), "num_tasks": 0}
    fields = [numeric_fields(r) for r in measured]
    agent_metrics.update(field_statistics(fields))
    summary, rows = group_metrics(measured, pass_threshold, answer_field)
    agent_metrics["num_tasks"] = len(rows)
    agent_metrics.update(summary)
    agent_metrics["num_repeats"] = len({r.get(ROLLOUT_INDEX, 0) for r in rollouts})
    agent_metrics.update(counts)
    key_metrics = {
        key: value
        for key, value in agent_metrics.items()
        if key in ("num_rollouts", "mean/reward", "std/reward", "mean/usage/total_tokens")
        or key.startswith(("pass@", "majority@", "coverage/"))
    }
    return {
        "agent_metrics": agent_metrics,
        "key_metrics": key_metrics,
        "group_level_metrics": rows,
        "repeat_level_metrics": repeat_metrics(measured, fields),
        "perf_summary": perf_summary(rollouts),
    }


NEMO_BLOCKS: dict[str, type] = {
    "agent_metrics": dict,
    "key_metrics": dict,
    "group_level_metrics": list,
    "repeat_level_metrics": list,
}


def nemo_shape(result: dict[str, Any]) -> dict[str, Any]:
    """An environment's metrics answered as NeMo Gym's ``AggregateMetrics``.

    Environments override ``aggregate_metrics`` and may return only some blocks; NeMo Gym's
    collector validates the answer and reads every block, so the missing ones are added empty.
    Everything the environment computed stays as it is.
    """
    return {**{key: kind() for key, kind in NEMO_BLOCKS.items()}, **result}
