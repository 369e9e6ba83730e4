"""The training page: what a ``gym train run`` (or a watch of a trainer's run) has written so far.

A training folder holds, and gains while the run goes:

* ``validation.jsonl``: one line per validation point and environment (step, env, eval_only,
  reward_mean, n): every point of the validation curves, trained and watched (``eval_only``);
* the rollouts behind each point, written as ``gym eval run`` writes them:
  ``validation_before.jsonl`` (step 0), ``validation/step_N.jsonl``, ``validation_after.jsonl``
  (the last point); the viewer opens each as a run of its own, so every point links to its rollouts;
* ``train_log.jsonl``: one line per step and environment with the planned and realized shares,
  the reward and the masked-share alarm (``masked_alarm``);
* ``run.json`` from the start: the run's settings, its ``--max-regression`` limits among them
  (``gym train run`` and ``gym train watch`` write it before the first validation);
* ``summary.json`` once the run has ended.

Alarms are shown as they fire: a masked-share alarm from the step log, and a validation
regression by the trainer's own rule (``polygym.collect.regression``: a point's reward fell by more
than the limit since step 0 and the 95% paired interval of the drop excludes 0, or nothing was
scored) for the environments of the run's ``--max-regression``, at the limits ``run.json`` gives
from the first point on, so the page never guesses a limit the run does not use (each alarm names
its limit). A folder without the record (written before it existed) raises no regression alarm.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym.collect.regression import judge_regression, task_rewards
from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS, ENV_FIELD
from polygym.view.runs import SUMMARY

CURVES = "validation.jsonl"
BEFORE, AFTER = "validation_before.jsonl", "validation_after.jsonl"
STEP_FILE = re.compile(r"step_(\d+)\.jsonl")
REGRESSION = "validation regression"


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True)
class Point:
    step: int
    env: str
    eval_only: bool
    reward_mean: float | None
    n: int


def read_curves(folder: Path) -> list[Point]:
    """Every validation point, by step then environment (a point logged twice: the later wins)."""
    latest: dict[tuple[int, str], Point] = {}
    path = folder / CURVES
    for line in iter_jsonl(path) if path.is_file() else []:
        step, env = line.get("step"), line.get("env")
        if isinstance(step, int) and isinstance(env, str):
            n = line.get("n")
            latest[(step, env)] = Point(
                step,
                env,
                bool(line.get("eval_only")),
                _number(line.get("reward_mean")),
                n if isinstance(n, int) else 0,
            )
    return [latest[k] for k in sorted(latest)]


def point_files(folder: Path, steps: list[int]) -> dict[int, Path]:
    """Validation step -> the rollouts file behind it (those written so far)."""
    out: dict[int, Path] = {}
    if (folder / BEFORE).is_file():
        out[0] = folder / BEFORE
    for path in sorted((folder / "validation").glob("step_*.jsonl")):
        found = STEP_FILE.fullmatch(path.name)
        if found:
            out[int(found.group(1))] = path
    if (folder / AFTER).is_file() and steps and max(steps) not in out:
        out[max(steps)] = folder / AFTER
    return out


RUN_RECORD = "run.json"
"""The run's settings, written at its start (``polygym.training.checkpoint.RUN_RECORD``; the view
does not import training, its sibling stratum)."""


def read_object(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when it is missing, unreadable or not an object (a run writes it)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def regression_limits(folder: Path) -> dict[str, float]:
    """The run's ``--max-regression`` limits (environment -> largest allowed drop), from its record."""
    limits = (read_object(folder / RUN_RECORD).get("settings") or {}).get("max_regression")
    if not isinstance(limits, dict):
        return {}
    return {env: float(value) for env, value in limits.items() if _number(value) is not None}


@dataclass
class Alarm:
    step: int
    env: str
    kind: str
    """``masked share`` or ``validation regression``."""
    text: str


@dataclass
class Training:
    points: list[Point]
    files: dict[int, Path]
    agents: dict[str, str]
    """Environment -> its agent (the name its validation rollouts carry)."""
    alarms: list[Alarm] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)
    """The run's ``--max-regression`` limits; none: no regression alarm."""
    ended: bool = False


def _agents(log: list[dict[str, Any]]) -> dict[str, str]:
    return {
        line["env"]: line["agent"]
        for line in log
        if isinstance(line.get("env"), str) and isinstance(line.get("agent"), str) and line["env"] != ALL_ENVS
    }


def _agents_of_rows(path: Path) -> dict[str, str]:
    """Environment (``_pg_env``) -> agent, from a validation file's rows (watched environments are
    in no step log)."""
    out: dict[str, str] = {}
    for row in iter_jsonl(path):
        env, ref = row.get(ENV_FIELD), row.get("agent_ref")
        if isinstance(env, str) and isinstance(ref, dict) and isinstance(ref.get("name"), str):
            out.setdefault(env, ref["name"])
    return out


def masked_alarms(log: list[dict[str, Any]]) -> list[Alarm]:
    return [
        Alarm(
            line["step"],
            line["env"],
            "masked share",
            f"{(_number(line.get('masked_share')) or 0):.0%} of the step's rollouts masked",
        )
        for line in log
        if line.get("masked_alarm") and isinstance(line.get("step"), int) and line.get("env") != ALL_ENVS
    ]


def regression_alarms(training: Training) -> list[Alarm]:
    """Each validation point after step 0 against step 0, by the trainer's own rule
    (``polygym.collect.regression``): the environments of the run's ``--max-regression`` at their
    limits."""
    base = training.files.get(0)
    if base is None or not training.limits:
        return []
    envs = sorted({p.env for p in training.points})
    limits = training.limits
    by_agent = {training.agents.get(env, env): env for env in envs}
    before = task_rewards(base, by_agent)
    out: list[Alarm] = []
    for step, path in sorted(training.files.items()):
        if step == 0:
            continue
        now = task_rewards(path, by_agent)
        for env, limit in sorted(limits.items()):
            verdict = judge_regression(env, step, before.get(env, {}), now.get(env, {}), limit)
            if verdict.alarm:
                out.append(Alarm(step, env, REGRESSION, verdict.describe()))
    return out


def read_training(folder: Path, log_path: Path | None) -> Training:
    log = list(iter_jsonl(log_path)) if log_path is not None and log_path.is_file() else []
    points = read_curves(folder)
    files = point_files(folder, [p.step for p in points])
    agents = {**(_agents_of_rows(files[0]) if 0 in files else {}), **_agents(log)}
    training = Training(points, files, agents, limits=regression_limits(folder))
    training.ended = bool(read_object(folder / SUMMARY))
    training.alarms = sorted(masked_alarms(log) + regression_alarms(training), key=lambda a: (a.step, a.env))
    return training


def signature(folder: Path, log_path: Path | None) -> tuple[tuple[str, int, int], ...]:
    """What the training page's numbers depend on besides the indexes: changes as the run writes."""
    paths = [folder / CURVES, folder / RUN_RECORD, folder / SUMMARY, folder / BEFORE, folder / AFTER]
    paths += sorted((folder / "validation").glob("step_*.jsonl"))
    if log_path is not None:
        paths.append(log_path)
    out = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        out.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(out)
