"""Scoring with reasoning-gym's own ``score_answer``, meant to run in a worker process (``CpuPool``).

The package is imported here, in the worker, and never in the server process: it takes about a
second and 100 MB (it pulls in numpy, sympy and matplotlib), and a scorer that hangs on a hostile
answer can then be killed with its worker. Every outcome is returned as ``(status, value)`` rather
than raised, so the server can tell a bad row (``unknown_task``, ``bad_config``: a 422) from an
answer the scorer choked on (``score_error``: reward 0) and from an installation that cannot score
at all (``broken_install``: a module reasoning-gym needs is missing). The last must never look like
the row's fault: a failed package import leaves a half-filled task registry behind, so without this
check every later row of that worker read "unknown task".
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any


@functools.lru_cache(maxsize=64)
def _dataset(task: str, config_json: str) -> Any:
    """The task's dataset object, rebuilt from the row's config (scorers may read their config)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **json.loads(config_json))


def known_tasks() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def score(task: str, config_json: str, entry: dict[str, Any], answer: str | None) -> tuple[str, Any]:
    """``("ok", score in [0, 1])``, or an error status and a message."""
    try:
        import reasoning_gym  # noqa: F401  (the whole package: it fills the task registry)
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        return "broken_install", f"reasoning-gym cannot be imported: {type(exc).__name__}: {exc}"
    if task not in DATASETS:
        return "unknown_task", f"unknown reasoning-gym task {task!r}"
    try:
        dataset = _dataset(task, config_json)
    except ImportError as exc:  # a task's own dependency, imported when its dataset is built
        return "broken_install", f"task {task} cannot be built: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return "bad_config", f"task_config for {task}: {type(exc).__name__}: {exc}"
    try:
        value = float(dataset.score_answer(answer, entry))
    except Exception as exc:
        return "score_error", f"{type(exc).__name__}: {str(exc)[:300]}"
    if not math.isfinite(value):
        return "score_error", f"the scorer returned {value!r}"
    return "ok", min(1.0, max(0.0, value))


def warm_up() -> bool:
    """Import the package in a worker ahead of the first real request."""
    import reasoning_gym  # noqa: F401

    return True
