"""The per-step story of a step-wise or training run, read from its step log.

Both ``X_steps.jsonl`` (step-wise collection) and a training run's ``train_log.jsonl`` hold one
line per step and environment (plus the ``_all`` roll-up) with the fields of
``polygym.blend.stepwise.EnvStepReport``; this module turns them into one series per environment,
ordered by step. A resumed run may log a step twice: the later line wins, as it replaced the
earlier one's rollouts. Validation of a training run (``validation_before`` / ``_after``
metrics files) gives each environment's reward before and after training.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS

SERIES_FIELDS = (
    "reward_mean",
    "target_share",
    "planned_share",
    "realized_share",
    "stragglers",
    "failures",
    "tokens",
    "completed",
)


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass
class Series:
    env: str
    steps: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=lambda: {f: [] for f in SERIES_FIELDS})


def read_steps(path: Path | None) -> dict[str, Series]:
    """Environment -> its series (the roll-up under ``ALL_ENVS``, last); empty without a log."""
    if path is None:
        return {}
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for line in iter_jsonl(path):
        env, step = line.get("env"), line.get("step")
        if isinstance(env, str) and isinstance(step, int):
            latest[(env, step)] = line
    by_env: dict[str, Series] = defaultdict(lambda: Series(""))
    for (env, step), line in sorted(latest.items(), key=lambda kv: (kv[0][0] == ALL_ENVS, kv[0])):
        series = by_env[env]
        series.env = env
        series.steps.append(step)
        for name in SERIES_FIELDS:
            series.values[name].append(_number(line.get(name)))
    return dict(by_env)


def read_validation(phases: dict[str, Path]) -> dict[str, dict[str, float]]:
    """Phase -> agent -> ``mean/reward``, from a training run's validation metrics files."""
    out: dict[str, dict[str, float]] = {}
    for phase, path in phases.items():
        try:
            entries = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        rewards: dict[str, float] = {}
        for entry in entries if isinstance(entries, list) else []:
            name = (entry.get("agent_ref") or {}).get("name") if isinstance(entry, dict) else None
            value = _number((entry.get("agent_metrics") or {}).get("mean/reward")) if name else None
            if isinstance(name, str) and value is not None:
                rewards[name] = value
        out[phase] = rewards
    return out
