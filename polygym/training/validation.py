"""Validation of a training run: the same rows, greedy, before training, every N steps and after.

Each validation collects one greedy rollout per validation row of every environment (``eval_only``
ones too) through the run's own collector, written as a ``gym eval run`` would
(``validation_before.jsonl``, ``validation/step_N.jsonl``, ``validation_after.jsonl``, each with its
aggregate metrics), and adds one line per environment to ``validation.jsonl``: the validation
curves. ``regressions`` applies the ``--max-regression`` rule (``regression``) to two of them.
``require_scored`` stops a run whose environment scored nothing before training: it would train for
hours on nothing from it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polygym.blend.mix import Blend
from polygym.collect.eval_run import run_eval
from polygym.collect.regression import Regression, judge_regression, task_rewards
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl
from polygym.row import Job, make_job, reward
from polygym.training.collector import TokenCollector


def validation_jobs(blend: Blend, limit: int | None, sampling: dict[str, Any]) -> list[Job]:
    """One greedy rollout per validation row of every environment (task indices run across them)."""
    jobs: list[Job] = []
    for env in blend.environments:
        rows = blend.stamped(env.name)
        for row in rows[:limit] if limit is not None else rows:
            jobs.append(make_job(row, env.agent, len(jobs), 0, sampling))
    return jobs


def validate(
    collector: TokenCollector, blend: Blend, output: Path, limit: int | None, max_tokens: int | None
) -> dict[str, list[float]]:
    """Collect the validation rollouts into ``output`` (a ``gym eval run`` file set); the rewards
    of each environment. The same rows every time (each environment's first ``limit``), greedy."""
    sampling: dict[str, Any] = {"temperature": 0.0}
    if max_tokens is not None:
        sampling["max_output_tokens"] = max_tokens
    jobs = validation_jobs(blend, limit, sampling)
    assert collector.client is not None
    files = RunFiles(output)
    collector.run(
        run_eval(collector.client, jobs, files, collector.limits, overwrite=True, progress_interval_s=60)
    )
    agents = {env.agent: env.name for env in blend.environments}
    rewards: dict[str, list[float]] = {env.name: [] for env in blend.environments}
    for rollout in iter_jsonl(files.output):
        env = agents.get((rollout.get("agent_ref") or {}).get("name", ""))
        if env is not None:
            rewards[env].append(reward(rollout))
    return rewards


class EnvironmentFailing(RuntimeError):
    """An environment none of whose step-0 validation rollouts could be scored.

    Training would go on for hours on nothing from it (its rollouts fail, TRL sees no reward) and
    its curve would be a line of NaN: seen on a machine where the environment's library missed a
    dependency. The message names each such environment and its first recorded failure.
    """


def require_scored(
    rewards: dict[str, list[float]], output: Path, blend: Blend, hint: str = "stopped before training"
) -> None:
    """Raise :class:`EnvironmentFailing` when an environment has no scored validation rollout,
    naming each such environment's first failure; ``hint`` says what the caller does about it
    (``gym train run`` stops before training, ``gym train watch`` has no baseline)."""
    dead = [env for env, values in rewards.items() if not values]
    if not dead:
        return
    agents = {env.agent: env.name for env in blend.environments}
    first: dict[str, str] = {}
    failures = RunFiles(output).failures
    for failure in iter_jsonl(failures) if failures.exists() else ():
        env = agents.get((failure.get("agent_ref") or {}).get("name", ""))
        if env in dead and env not in first:
            first[env] = f"{failure.get('error_class')}: {failure.get('error')}"
    found = (f"{env}: no validation rollout was scored ({first.get(env, 'none recorded')})" for env in dead)
    raise EnvironmentFailing("; ".join(found) + f"; {hint} (failures in {failures})")


def mean_rewards(rewards: dict[str, list[float]]) -> dict[str, float]:
    return {env: statistics.fmean(values) if values else math.nan for env, values in rewards.items()}


def regressions(
    step: int, base: Path, now: Path, limits: dict[str, float], agents: dict[str, str]
) -> list[Regression]:
    """The ``--max-regression`` alarms of the validation at ``step``: one per environment of
    ``limits`` that :func:`regression.judge_regression` flags (``base``, ``now``: the step-0 and
    step-``step`` validations' rollout files; ``agents``: environment -> agent, the names they use)."""
    by_agent = {agent: env for env, agent in agents.items()}
    before, after = task_rewards(base, by_agent), task_rewards(now, by_agent)
    verdicts = (judge_regression(env, step, before[env], after[env], limit) for env, limit in limits.items())
    return [verdict for verdict in verdicts if verdict.alarm]


def validation_file(out: Path, step: int, final: bool = False) -> Path:
    """Where the validation after ``step`` updates is written (the one before any update, those
    every ``--validate-every`` steps, the one at the end)."""
    if final:
        return out / "validation_after.jsonl"
    return out / "validation_before.jsonl" if step == 0 else out / "validation" / f"step_{step}.jsonl"


def validation_lines(step: int, rewards: dict[str, list[float]], blend: Blend) -> list[dict[str, Any]]:
    """``validation.jsonl`` lines: one per environment (trained or eval_only) after ``step`` updates."""
    watched = {env.name for env in blend.environments if env.spec.eval_only}
    return [
        {
            "step": step,
            "env": env,
            "eval_only": env in watched,
            "reward_mean": statistics.fmean(values) if values else None,
            "n": len(values),
        }
        for env, values in rewards.items()
    ]


def validation_means(lines: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """``validation.jsonl`` lines as ``{step: {env: mean reward}}``."""
    out: dict[int, dict[str, float]] = {}
    for line in lines:
        out.setdefault(line["step"], {})[line["env"]] = line_mean(line)
    return out


def line_mean(line: dict[str, Any]) -> float:
    value = line.get("reward_mean")
    return float(value) if value is not None else math.nan
