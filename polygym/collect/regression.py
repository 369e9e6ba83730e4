"""The ``--max-regression ENV=DELTA`` rule: when has an environment's validation reward regressed?

Alarm at a validation when **either**

1. the environment has no scored validation rollout there (every one failed, or the file holds
   none of its prompts): an empty validation is an alarm, never a crash or a silent pass; or
2. its reward **fell by more than DELTA** since step 0 (the point drop, ``before - now`` over the
   prompts both validations scored, strictly greater than DELTA) **and** the 95% paired-bootstrap
   interval of that drop **excludes 0** (its lower end is above 0: the fall is not one or two
   flipped answers of noise). With fewer than 2 shared prompts there is no interval and the point
   drop alone decides.

Why this rule: the one it replaces waited until the whole interval lay below ``-DELTA``, so with 32
validation prompts DELTA 0.10 fired only at drops of about 0.28. Here DELTA is the drop a user
tolerates, read as written, and the interval only guards against alarms on noise; the alarm shows
both, so a reader can check the verdict. Intervals come from ``collect.statistics`` (the same
paired bootstrap as ``gym eval compare``, seeded: the same files give the same verdict).

``judge_regression`` is pure (per-prompt rewards in, a verdict out) so every consumer (``gym train
run``'s validations, a watcher of a run in progress) applies the same rule; ``task_rewards`` reads
a validation's rollout file into the per-prompt rewards it takes.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from polygym.collect.statistics import DEFAULT_CONFIDENCE, delta
from polygym.jsonl import iter_jsonl
from polygym.row import TASK_INDEX, reward

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Regression:
    """One environment's verdict at one validation."""

    env: str
    step: int
    limit: float
    """DELTA: the largest drop tolerated."""
    alarm: bool
    before: float | None
    """Mean reward at step 0 over the prompts both validations scored (None: none scored)."""
    now: float | None
    """The same at ``step`` (None: none scored)."""
    drop: float | None
    """``before - now``; positive when the reward fell."""
    interval: tuple[float, float] | None
    """95% interval of the drop (None: fewer than 2 shared prompts, or nothing scored now)."""
    n: int
    """Prompts behind the drop (both validations scored them)."""

    def describe(self) -> str:
        """The alarm line a user reads (also for a verdict without alarm)."""
        if self.drop is None or self.before is None or self.now is None:
            empty = f"step {self.step}" if self.now is None else "step 0"
            return f"{self.env}: no validation rollout was scored at {empty} (--max-regression alarm)"
        if self.interval is None:
            where = "no interval (fewer than 2 shared prompts)"
        else:
            low, high = self.interval
            verdict = "excludes 0" if low > 0 or high < 0 else "includes 0"
            where = f"{DEFAULT_CONFIDENCE:.0%} interval of the drop [{low:+.3f}, {high:+.3f}], {verdict}"
        compared = "more than" if self.drop > self.limit else "not more than"
        return (
            f"{self.env} validation reward fell {self.drop:+.3f} since step 0 ({self.before:.3f} -> "
            f"{self.now:.3f} over {self.n} prompts; {where}): {compared} --max-regression {self.limit:g}"
        )


def judge_regression(
    env: str, step: int, before: Mapping[K, float], now: Mapping[K, float], limit: float
) -> Regression:
    """The rule of the module docstring. ``before``/``now``: reward per validation prompt (any
    hashable key, the same for the same prompt) at step 0 and at ``step``; ``limit``: DELTA >= 0."""
    if not before or not now:
        mean_before = statistics.fmean(before.values()) if before else None
        mean_now = statistics.fmean(now.values()) if now else None
        return Regression(env, step, limit, True, mean_before, mean_now, None, None, 0)
    change = delta(before, now)  # now - before: paired over the shared prompts, else Welch
    assert change.mean is not None  # both sides hold at least one prompt
    shared = [k for k in before if k in now]
    keys_before, keys_now = (shared, shared) if shared else (list(before), list(now))
    mean_before = statistics.fmean(before[k] for k in keys_before)
    mean_now = statistics.fmean(now[k] for k in keys_now)
    drop = -change.mean
    # 0.0 - x: a drop of exactly 0 reads +0.000, not -0.000
    interval = (
        (0.0 - change.high, 0.0 - change.low) if change.low is not None and change.high is not None else None
    )
    significant = interval is None or interval[0] > 0
    return Regression(
        env, step, limit, drop > limit and significant, mean_before, mean_now, drop, interval, change.n
    )


def task_rewards(path: Path, agents: Mapping[str, str]) -> dict[str, dict[int, float]]:
    """Per environment (``agents``: agent name -> environment), the reward of each validation prompt
    in a rollout file (its task index; repeats of one prompt averaged). Environments with no scored
    rollout map to an empty dict."""
    values: dict[str, dict[int, list[float]]] = {env: {} for env in agents.values()}
    for row in iter_jsonl(path) if path.exists() else ():
        env = agents.get((row.get("agent_ref") or {}).get("name", ""))
        if env is not None:
            values[env].setdefault(int(row[TASK_INDEX]), []).append(reward(row))
    return {
        env: {task: statistics.fmean(r) for task, r in by_task.items()} for env, by_task in values.items()
    }
