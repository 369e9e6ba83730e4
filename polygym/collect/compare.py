"""Comparing two runs' ``_aggregate_metrics.json``, environment by environment.

Multi-environment training can raise one environment's reward while quietly lowering another's;
a single averaged number hides exactly that. ``compare`` lines up the two runs per agent (one
agent = one environment), computes the delta of every quality metric both runs report, and flags
a regression wherever the new run is worse by more than ``threshold`` (absolute). An environment
present in the base run but missing from the new one is also a regression: silently losing an
environment is what this check exists to catch.

Quality metrics are higher-is-better: ``mean/reward``, ``pass@k``, ``pass@1[avg-of-k]`` and
``majority@k`` by default; ``metrics`` may name others (``*`` globs allowed), and those are
judged too unless they are counts, spreads, tokens or latencies (``num_failures``, ``std/...``,
``latency/...``), which are shown but never judged.

Either side may be one metrics file or a folder: every ``*_aggregate_metrics.json`` below it is
read, and an agent appearing in several files of one folder is keyed ``file::agent``.
"""

from __future__ import annotations

import fnmatch
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym.row import ALL_ENVS, env_label

METRICS_SUFFIX = "_aggregate_metrics.json"
DEFAULT_METRICS = ("mean/reward", "pass@*", "majority@*")
DEFAULT_THRESHOLD = 0.02
NOT_JUDGED = ("num_*", "std/*", "min/*", "max/*", "median/*", "latency/*", "*usage/*", "*tokens*")


class CompareError(Exception):
    """Inputs that cannot be compared (missing, unreadable, not metrics)."""


@dataclass
class MetricDelta:
    metric: str
    base: float | None
    new: float | None
    delta: float | None
    regression: bool


@dataclass
class EnvComparison:
    env: str
    status: str
    """``ok``, ``regression``, ``missing`` (only in base) or ``added`` (only in new)."""
    metrics: list[MetricDelta] = field(default_factory=list)


@dataclass
class Comparison:
    base: str
    new: str
    threshold: float
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
                    out.append(f"{name}: {m.metric} {m.base:.4f} -> {m.new:.4f} ({m.delta:+.4f})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "new": self.new,
            "threshold": self.threshold,
            "environments": [asdict(env) for env in self.environments],
            "regressions": self.regressions,
        }


def _metrics_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob(f"*{METRICS_SUFFIX}") if p.is_file())
        if not files:
            raise CompareError(f"{path}: no *{METRICS_SUFFIX} files in this folder")
        return files
    raise CompareError(f"{path}: no such file or folder")


def load_metrics(path: Path) -> dict[str, dict[str, Any]]:
    """``agent -> agent_metrics`` from a metrics file or a folder of them."""
    files = _metrics_files(path)
    by_file: list[tuple[Path, str, dict[str, Any]]] = []
    for file in files:
        try:
            entries = orjson.loads(file.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise CompareError(f"{file}: not valid JSON: {exc}") from None
        if not isinstance(entries, list):
            raise CompareError(f"{file}: expected a list of per-agent entries (an _aggregate_metrics.json)")
        for i, entry in enumerate(entries):
            ref = entry.get("agent_ref") if isinstance(entry, dict) else None
            name = ref.get("name") if isinstance(ref, dict) else None
            metrics = entry.get("agent_metrics") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(metrics, dict):
                raise CompareError(f"{file}: entry {i}: needs agent_ref.name and agent_metrics")
            by_file.append((file, name, metrics))
    counts: dict[str, int] = {}
    for _, name, _ in by_file:
        counts[name] = counts.get(name, 0) + 1
    root = path if path.is_dir() else path.parent
    out: dict[str, dict[str, Any]] = {}
    for file, name, metrics in by_file:
        key = name if counts[name] == 1 else f"{file.relative_to(root)}::{name}"
        out[key] = metrics
    return out


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _selected(names: set[str], patterns: Sequence[str]) -> list[str]:
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))


def judged(metric: str) -> bool:
    """Whether a lower value is a regression: quality metrics yes; counts, spreads, tokens and
    latencies (where lower is not worse, or not comparable) no."""
    return not any(fnmatch.fnmatchcase(metric, p) for p in NOT_JUDGED)


def _env_comparison(
    env: str,
    base: dict[str, float] | None,
    new: dict[str, float] | None,
    patterns: Sequence[str],
    threshold: float,
) -> EnvComparison:
    names = set(base or {}) | set(new or {})
    deltas = []
    for metric in _selected(names, patterns):
        b = base.get(metric) if base is not None else None
        n = new.get(metric) if new is not None else None
        delta = n - b if b is not None and n is not None else None
        regression = delta is not None and judged(metric) and delta < -threshold - 1e-12
        deltas.append(MetricDelta(metric, b, n, delta, regression))
    if new is None:
        status = "missing"
    elif base is None:
        status = "added"
    else:
        status = "regression" if any(d.regression for d in deltas) else "ok"
    return EnvComparison(env, status, deltas)


def _macro_average(runs: dict[str, dict[str, float]], envs: list[str]) -> dict[str, float]:
    """Each metric averaged over the environments that report it (every environment counts once)."""
    names = set().union(*(runs[e].keys() for e in envs)) if envs else set()
    out = {}
    for name in names:
        values = [runs[e][name] for e in envs if name in runs[e]]
        if len(values) == len(envs):
            out[name] = statistics.fmean(values)
    return out


def compare(
    base_path: Path,
    new_path: Path,
    threshold: float = DEFAULT_THRESHOLD,
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> Comparison:
    """Per-environment deltas of ``metrics`` between two runs, plus an all-environments roll-up.

    The roll-up averages each metric over the environments both runs have, so one environment's
    gain cannot mask another's loss by sheer row count; it is judged like any environment.
    """
    if threshold < 0:
        raise CompareError(f"threshold must be >= 0, got {threshold}")
    base = {k: _numeric(v) for k, v in load_metrics(base_path).items()}
    new = {k: _numeric(v) for k, v in load_metrics(new_path).items()}
    envs = [*sorted(base), *sorted(k for k in new if k not in base)]
    rows = [_env_comparison(e, base.get(e), new.get(e), metrics, threshold) for e in envs]
    shared = sorted(set(base) & set(new))
    if len(shared) > 1:
        rows.append(
            _env_comparison(
                ALL_ENVS, _macro_average(base, shared), _macro_average(new, shared), metrics, threshold
            )
        )
    return Comparison(str(base_path), str(new_path), threshold, rows)
