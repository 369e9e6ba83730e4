"""Comparing a base run with one or more candidates, environment by environment, with intervals.

Multi-environment training can raise one environment's reward while quietly lowering another's;
a single averaged number hides exactly that. ``compare`` lines up the runs per agent (one agent =
one environment) and, for every quality metric, gives the candidate-minus-base delta **with a
confidence interval** when the runs' rollout files are there (``X.jsonl`` next to
``X_aggregate_metrics.json``): each task's rollouts are averaged into one value per task, the tasks
both runs ran are paired by their identity (``task_identity``: ``_ng_task_index``, as the run's
metrics file groups them) and a seeded paired bootstrap gives the interval (Welch's t interval when
the runs share no task; ``polygym.collect.statistics``). With only the metrics file there is no
per-task value, so the delta is a point estimate and says so. A base or new value computed from
rollouts is the metrics file's: ``mean/reward`` the mean over scored rollouts, ``pass@k`` the mean
over tasks (``run_value``); a delta is always the mean over paired tasks of each task's change
(the same thing when every task has as many rollouts). Rollouts a verifier masked
(``mask_sample``) are left out, as the metrics file leaves them out. ``gym view`` compares with
this module too (``compare_runs`` on the runs it indexed), so its numbers are these.

**Regression** (``threshold`` absolute, default 0.02): a judged metric regressed when its whole
interval lies below ``-threshold``, i.e. its upper bound is below ``-threshold``: the drop is
larger than the threshold at the chosen confidence, not merely noise. Without an interval, the
point delta below ``-threshold`` counts (the old rule, flagged as ``point``). An environment in the
base run but missing from a candidate is a regression too: silently losing one is what this check
exists to catch. A task is *solved* when at least half of its rollouts pass; the flips of an
environment are the shared tasks solved in one run and not the other.

Quality metrics are higher-is-better: ``mean/reward``, ``pass@k``, ``pass@1[avg-of-k]`` and
``majority@k`` by default; ``metrics`` may name others (``*`` globs allowed), and those are
judged too unless they are counts, spreads, tokens or latencies (``num_failures``, ``std/...``,
``latency/...``), which are shown but never judged. Per-task values (hence intervals) exist for
``mean/reward``, ``pass@1[avg-of-k]`` and ``pass@k``.

Each side may be a metrics file, a rollouts file, or a folder: every ``*_aggregate_metrics.json``
below it is read, and an agent appearing in several files of one folder is keyed ``file::agent``.
A rollouts file without a metrics file is aggregated on the fly.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym import metrics as run_metrics
from polygym.collect import statistics as stats
from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS, PASS_THRESHOLD, TASK_INDEX, env_label, reward

METRICS_SUFFIX = "_aggregate_metrics.json"
REWARD = "mean/reward"
DEFAULT_METRICS = (REWARD, "pass@*", "majority@*")
DEFAULT_THRESHOLD = 0.02
NOT_JUDGED = ("num_*", "std/*", "min/*", "max/*", "median/*", "latency/*", "*usage/*", "*tokens*")

TaskId = int | str
Tasks = dict[TaskId, list[float]]
"""One environment's rollouts: the rewards of each task (``task_identity``)."""
PROMPT_TASK = "prompt:"
"""The prefix of a task identity made from the prompt (rows without ``_ng_task_index``)."""


class CompareError(Exception):
    """Inputs that cannot be compared (missing, unreadable, not metrics)."""


@dataclass
class MetricDelta:
    metric: str
    base: float | None
    new: float | None
    delta: float | None
    regression: bool
    low: float | None = None
    high: float | None = None
    method: str = "point"
    """``paired-bootstrap``, ``welch`` or ``point`` (no per-task values: no interval)."""


@dataclass
class EnvComparison:
    env: str
    status: str
    """``ok``, ``regression``, ``missing`` (only in base) or ``added`` (only in new)."""
    metrics: list[MetricDelta] = field(default_factory=list)
    paired_tasks: int = 0
    lost: list[TaskId] = field(default_factory=list)
    """Tasks (``task_identity``) solved in base and not in the candidate."""
    gained: list[TaskId] = field(default_factory=list)
    note: str = ""


@dataclass
class CandidateComparison:
    new: str
    environments: list[EnvComparison]

    @property
    def regressions(self) -> list[str]:
        out = []
        for env in self.environments:
            name = env_label(env.env)
            if env.status == "missing":
                out.append(f"{name}: missing in the new run")
            for m in env.metrics:
                if m.regression:
                    out.append(f"{name}: {m.metric} {m.base:.4f} -> {m.new:.4f} ({m.delta:+.4f}{_ci(m)})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "new": self.new,
            "environments": [asdict(env) for env in self.environments],
            "regressions": self.regressions,
        }


def _ci(m: MetricDelta) -> str:
    return (
        f", CI [{m.low:+.4f}, {m.high:+.4f}]" if m.low is not None and m.high is not None else ", no interval"
    )


@dataclass
class Comparison:
    base: str
    candidates: list[CandidateComparison]
    threshold: float
    confidence: float = stats.DEFAULT_CONFIDENCE
    resamples: int = stats.DEFAULT_RESAMPLES
    seed: int = stats.DEFAULT_SEED

    @property
    def regressions(self) -> list[str]:
        """Every candidate's regressions, prefixed by the candidate when there are several."""
        if len(self.candidates) == 1:
            return self.candidates[0].regressions
        return [f"{c.new}: {line}" for c in self.candidates for line in c.regressions]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report. With one candidate its ``new`` and ``environments`` are repeated at the
        top level too: the two-run shape that ``comparison.json`` readers already rely on."""
        single = self.candidates[0].to_dict() if len(self.candidates) == 1 else {}
        return {
            "base": self.base,
            **{k: single[k] for k in ("new", "environments") if k in single},
            "threshold": self.threshold,
            "confidence": self.confidence,
            "bootstrap": self.resamples,
            "seed": self.seed,
            "candidates": [c.to_dict() for c in self.candidates],
            "regressions": self.regressions,
        }


@dataclass
class EnvRun:
    metrics: dict[str, float]
    tasks: Tasks | None
    """None when the run's rollouts file is absent."""
    _values: dict[str, dict[TaskId, float]] | None = field(default=None, repr=False)

    def values(self) -> dict[str, dict[TaskId, float]]:
        """``task_values`` of the run's tasks, computed once (every metric and the roll-up use them)."""
        if self._values is None:
            self._values = task_values(self.tasks) if self.tasks is not None else {}
        return self._values


def _metrics_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob(f"*{METRICS_SUFFIX}") if p.is_file())
        if not files:
            raise CompareError(f"{path}: no *{METRICS_SUFFIX} files in this folder")
        return files
    raise CompareError(f"{path}: no such file or folder")


def _rollouts_of(metrics_file: Path) -> Path:
    return metrics_file.with_name(metrics_file.name[: -len(METRICS_SUFFIX)] + ".jsonl")


def _agent(row: dict[str, Any]) -> str | None:
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def task_identity(row: Mapping[str, Any]) -> TaskId:
    """The task a rollout belongs to, the one identity ``gym eval run``'s metrics, ``gym eval
    compare`` and ``gym view`` share: ``_ng_task_index`` (what ``gym eval run`` and NeMo Gym write,
    the same for every repeat of one input row). A row without it (a file made by another tool) is
    identified by its prompt, ``"prompt:"`` and a digest of ``responses_create_params.input``:
    seeded or game environments whose rows share one prompt then count as one task, so the index
    is always preferred."""
    task = row.get(TASK_INDEX)
    if isinstance(task, int) and not isinstance(task, bool):
        return task
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, Mapping) else None
    digest = hashlib.blake2b(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS), digest_size=8)
    return PROMPT_TASK + digest.hexdigest()


def read_rollouts(path: Path) -> tuple[dict[str, Tasks], list[dict[str, Any]]]:
    """Rewards by agent and task (``task_identity``), plus the rows. Rows without an agent are left
    out (they belong to no environment); masked rows (``mask_sample``) are rows but not rewards,
    as in the metrics file."""
    tasks: dict[str, Tasks] = defaultdict(lambda: defaultdict(list))
    rows = []
    for row in iter_jsonl(path):
        agent = _agent(row)
        if agent is None:
            continue
        rows.append(row)
        if not row.get(run_metrics.MASK_SAMPLE):
            tasks[agent][task_identity(row)].append(reward(row))
    return {a: dict(t) for a, t in tasks.items()}, rows


def _entries(file: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        entries = orjson.loads(file.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise CompareError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise CompareError(f"{file}: expected a list of per-agent entries (an _aggregate_metrics.json)")
    out = []
    for i, entry in enumerate(entries):
        name = _agent(entry) if isinstance(entry, dict) else None
        values = entry.get("agent_metrics") if isinstance(entry, dict) else None
        if name is None or not isinstance(values, dict):
            raise CompareError(f"{file}: entry {i}: needs agent_ref.name and agent_metrics")
        out.append((name, values))
    return out


def _read_file(file: Path) -> list[tuple[str, EnvRun]]:
    """One run's environments from its metrics file or its rollouts file (the other one beside it)."""
    if file.name.endswith(".jsonl") and not file.name.endswith(METRICS_SUFFIX):
        tasks, rows = read_rollouts(file)
        metrics_file = file.with_name(file.name[: -len(".jsonl")] + METRICS_SUFFIX)
        if metrics_file.is_file():
            return [(n, EnvRun(_numeric(v), tasks.get(n))) for n, v in _entries(metrics_file)]
        if not tasks:
            raise CompareError(f"{file}: no rollouts with agent_ref.name")
        by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_agent[str(_agent(row))].append(row)
        return [
            (n, EnvRun(_numeric(run_metrics.aggregate(r)["agent_metrics"]), tasks[n]))
            for n, r in sorted(by_agent.items())
        ]
    entries = _entries(file)
    rollouts = _rollouts_of(file)
    tasks = read_rollouts(rollouts)[0] if rollouts.is_file() else {}
    return [(n, EnvRun(_numeric(v), tasks.get(n) if rollouts.is_file() else None)) for n, v in entries]


def load_run(path: Path) -> dict[str, EnvRun]:
    """``agent -> EnvRun`` from a metrics file, a rollouts file or a folder of metrics files."""
    by_file = [(file, name, env) for file in _metrics_files(path) for name, env in _read_file(file)]
    counts: dict[str, int] = defaultdict(int)
    for _, name, _ in by_file:
        counts[name] += 1
    root = path if path.is_dir() else path.parent
    return {
        (name if counts[name] == 1 else f"{file.relative_to(root)}::{name}"): env
        for file, name, env in by_file
    }


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def task_values(tasks: Tasks) -> dict[str, dict[TaskId, float]]:
    """``metric -> task -> value`` for the metrics that exist per task, named as in the metrics file
    (pass@k only for tasks with at least k rollouts)."""
    out: dict[str, dict[TaskId, float]] = defaultdict(dict)
    reward, average = out[REWARD], out["pass@1[avg-of-k]"]
    for task, rewards in tasks.items():
        n, c = len(rewards), sum(r >= PASS_THRESHOLD for r in rewards)
        reward[task] = math.fsum(rewards) / n
        average[task] = c / n
        for name, value in _pass_rates(n, c):
            out[name][task] = value
    return dict(out)


@functools.lru_cache(maxsize=4096)
def _pass_rates(n: int, c: int) -> tuple[tuple[str, float], ...]:
    """``pass@k`` of a task with ``n`` rollouts, ``c`` passing (few distinct pairs in a run)."""
    return tuple((f"pass@{k}", run_metrics.pass_at_k(n, c, k)) for k in run_metrics.k_values(n))


def run_value(metric: str, tasks: Tasks, values: dict[TaskId, float]) -> float:
    """One run's value of a per-task metric, as its metrics file has it: ``mean/reward`` over the
    scored rollouts (a task with more rollouts weighs more: identical input rows share a task),
    the others (``pass@k``...) over tasks."""
    if metric == REWARD:
        return math.fsum(math.fsum(r) for r in tasks.values()) / sum(map(len, tasks.values()))
    return statistics.fmean(values.values())


def task_summary(tasks: Tasks, values: dict[str, dict[TaskId, float]] | None = None) -> dict[str, float]:
    """One environment's numbers from its tasks as its metrics file has them (``run_value``):
    ``mean/reward``, ``pass@1[avg-of-k]`` and the ``pass@k`` every task has, with ``num_tasks``
    and ``num_rollouts`` (``values``: the tasks' ``task_values``, when already computed)."""
    values = task_values(tasks) if values is None else values
    out = {"num_tasks": float(len(tasks)), "num_rollouts": float(sum(map(len, tasks.values())))}
    out.update({m: run_value(m, tasks, v) for m, v in values.items() if len(v) == len(tasks)})
    return out


def _selected(names: set[str], patterns: Sequence[str]) -> list[str]:
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))


def judged(metric: str) -> bool:
    """Whether a lower value is a regression: quality metrics yes; counts, spreads, tokens and
    latencies (where lower is not worse, or not comparable) no."""
    return not any(fnmatch.fnmatchcase(metric, p) for p in NOT_JUDGED)


@dataclass(frozen=True)
class Settings:
    patterns: Sequence[str]
    threshold: float
    confidence: float
    resampler: stats.Resampler


def _is_regression(metric: str, est: stats.Estimate, threshold: float) -> bool:
    if est.mean is None or not judged(metric):
        return False
    bound = est.high if est.high is not None else est.mean
    return bound < -threshold - 1e-12


def _metric_delta(
    metric: str, b: float | None, n: float | None, est: stats.Estimate, cfg: Settings
) -> MetricDelta:
    return MetricDelta(
        metric,
        b,
        n,
        est.mean,
        _is_regression(metric, est, cfg.threshold),
        est.low,
        est.high,
        est.method if est.low is not None else "point",
    )


def _env_comparison(env: str, base: EnvRun | None, new: EnvRun | None, cfg: Settings) -> EnvComparison:
    if base is None or new is None:
        only = base or new
        assert only is not None
        deltas = [
            MetricDelta(m, only.metrics[m] if base else None, only.metrics[m] if new else None, None, False)
            for m in _selected(set(only.metrics), cfg.patterns)
        ]
        return EnvComparison(env, "missing" if new is None else "added", deltas)
    bv, nv = base.values(), new.values()
    deltas = []
    b: float | None
    n: float | None
    for metric in _selected(set(base.metrics) | set(new.metrics) | set(bv) | set(nv), cfg.patterns):
        if metric in bv and metric in nv:
            est = stats.delta(bv[metric], nv[metric], cfg.confidence, cfg.resampler, env)
            b = run_value(metric, base.tasks or {}, bv[metric])
            n = run_value(metric, new.tasks or {}, nv[metric])
        else:
            b, n = base.metrics.get(metric), new.metrics.get(metric)
            point = n - b if b is not None and n is not None else None
            est = stats.Estimate(point, None, None, 0)
        deltas.append(_metric_delta(metric, b, n, est, cfg))
    out = EnvComparison(env, "regression" if any(d.regression for d in deltas) else "ok", deltas)
    if base.tasks is not None and new.tasks is not None:
        found = stats.flips(base.tasks, new.tasks)
        out.lost, out.gained = found.lost, found.gained
        out.paired_tasks = len(base.tasks.keys() & new.tasks.keys())
    else:
        out.note = "no rollouts file: point deltas only, no interval"
    return out


def _rollup(base: dict[str, EnvRun], new: dict[str, EnvRun], envs: list[str], cfg: Settings) -> EnvComparison:
    """Each metric averaged over the shared environments (every environment counts once); its
    interval resamples tasks within each environment when every one of them is paired."""
    names = _selected(
        set().union(*(base[e].metrics.keys() & new[e].metrics.keys() for e in envs)), cfg.patterns
    )
    paired = all(base[e].tasks is not None and new[e].tasks is not None for e in envs)
    values = {e: (base[e].values(), new[e].values()) for e in envs} if paired else {}
    deltas = []
    for metric in names:
        if not all(metric in base[e].metrics and metric in new[e].metrics for e in envs):
            continue
        b = statistics.fmean(base[e].metrics[metric] for e in envs)
        n = statistics.fmean(new[e].metrics[metric] for e in envs)
        strata = {}
        for e in envs:
            bv, nv = (v.get(metric, {}) for v in values.get(e, ({}, {})))
            strata[e] = [nv[k] - bv[k] for k in bv if k in nv]  # delta()'s order: the same draws
        if paired and all(strata.values()):
            est = stats.paired_bootstrap(strata, cfg.confidence, cfg.resampler)
            b = statistics.fmean(run_value(metric, base[e].tasks or {}, values[e][0][metric]) for e in envs)
            n = statistics.fmean(run_value(metric, new[e].tasks or {}, values[e][1][metric]) for e in envs)
        else:
            est = stats.Estimate(n - b, None, None, 0)
        deltas.append(_metric_delta(metric, b, n, est, cfg))
    return EnvComparison(ALL_ENVS, "regression" if any(d.regression for d in deltas) else "ok", deltas)


def _only(run: dict[str, EnvRun], agents: Sequence[str]) -> dict[str, EnvRun]:
    return {k: v for k, v in run.items() if k in agents} if agents else run


def _candidate(
    base: dict[str, EnvRun], name: str, new: dict[str, EnvRun], cfg: Settings
) -> CandidateComparison:
    envs = [*sorted(base), *sorted(k for k in new if k not in base)]
    rows = [_env_comparison(e, base.get(e), new.get(e), cfg) for e in envs]
    shared = sorted(set(base) & set(new))
    if len(shared) > 1:
        rows.append(_rollup(base, new, shared, cfg))
    return CandidateComparison(name, rows)


def compare(
    base_path: Path,
    candidates: Path | Sequence[Path],
    threshold: float = DEFAULT_THRESHOLD,
    metrics: Sequence[str] = DEFAULT_METRICS,
    confidence: float = stats.DEFAULT_CONFIDENCE,
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
    agents: Sequence[str] = (),
) -> Comparison:
    """Every candidate against the base, per environment, plus an all-environments roll-up.

    The roll-up averages each metric over the environments both runs have, so one environment's
    gain cannot mask another's loss by sheer row count; it is judged like any environment.
    Deterministic: the same inputs and ``seed`` give the same intervals. ``agents``, when given,
    limits the comparison to those environments; one the base run lacks is an error.
    """
    if threshold < 0:
        raise CompareError(f"threshold must be >= 0, got {threshold}")
    if not 0 < confidence < 1:
        raise CompareError(f"confidence must be strictly between 0 and 1, got {confidence}")
    if resamples < 1:
        raise CompareError(f"bootstrap resamples must be >= 1, got {resamples}")
    paths = [candidates] if isinstance(candidates, Path) else list(candidates)
    if not paths:
        raise CompareError("no candidate run to compare with the base")
    base = load_run(base_path)
    unknown = [a for a in agents if a not in base]
    if unknown:
        raise CompareError(
            f"{base_path}: no environment {', '.join(unknown)} (it has: {', '.join(sorted(base))})"
        )
    news = [(str(p), _only(load_run(p), agents)) for p in paths]
    return compare_runs(
        str(base_path), _only(base, agents), news, threshold, metrics, confidence, resamples, seed
    )


def compare_runs(
    base_name: str,
    base: dict[str, EnvRun],
    candidates: Sequence[tuple[str, dict[str, EnvRun]]],
    threshold: float = DEFAULT_THRESHOLD,
    metrics: Sequence[str] = DEFAULT_METRICS,
    confidence: float = stats.DEFAULT_CONFIDENCE,
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
) -> Comparison:
    """``compare`` on runs already read (``environment -> EnvRun``), e.g. by ``gym view``'s index."""
    cfg = Settings(metrics, threshold, confidence, stats.Resampler(resamples, seed))
    results = [_candidate(base, name, new, cfg) for name, new in candidates]
    return Comparison(base_name, results, threshold, confidence, resamples, seed)
