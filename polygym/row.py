"""The rollout row: its field names, the values read off it, and the job that produces it.

A rollout row (DESIGN §3) is the dataset row as sent (``responses_create_params``, ``agent_ref``,
verifier fields) plus ``response``, ``reward``, the verifier's fields and NeMo Gym's indices
``_ng_task_index`` / ``_ng_rollout_index``; step-wise collection adds ``_pg_step`` and ``_pg_env``.
Like NeMo Gym 0.7's collector, every result (rollout or failure) also carries the ``CARRIED_FIELDS``
of the row as sent, whatever its agent answered, and a resumed retry says which attempt it is.
Every module that writes or reads rows takes these names, the reward and the token count from
here, so that a metrics file, a step log and a trainer never disagree about the same rollout.

**Reward.** ``reward`` is a number; a verifier may also return a boolean (Python's ``True`` is an
``int``, and pydantic's ``float`` field accepts it): ``True`` counts 1.0 and ``False`` 0.0, as in
``VerifyResponse``. Anything else (missing, ``null``, a string, NaN, infinity) counts 0.0, so one
malformed row cannot turn an environment's mean into NaN. A rollout *passes* when its reward is at
least ``PASS_THRESHOLD``.

**All environments.** Per-environment records (step logs, training logs, comparisons) carry the
roll-up over every environment under the key ``ALL_ENVS``; tables shown to people print it as
``ALL_ENVS_LABEL``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polygym.kinds import AGENT_KIND

TASK_INDEX = "_ng_task_index"
"""Identical input rows share it (so pass@k groups their rollouts)."""
ROLLOUT_INDEX = "_ng_rollout_index"
"""0..n-1 within a task."""
INDEX_FIELDS = (TASK_INDEX, ROLLOUT_INDEX)
ATTEMPT_INDEX = "_ng_attempt_index"
"""How many failed attempts of the rollout came before it; set only on a retry (``--resume``)."""
ROLLOUT_ID = "_ng_rollout_id"
"""A rollout id the row gives explicitly (NeMo Gym 0.7 keys captured model calls by it)."""
CARRIED_FIELDS = ("agent_ref", "task_source", "skills_ref", ATTEMPT_INDEX, ROLLOUT_ID)
"""Fields of the row as sent that NeMo Gym 0.7's collector copies onto the result; so do we."""
STEP_FIELD = "_pg_step"
"""Training step of a rollout collected step by step."""
ENV_FIELD = "_pg_env"
"""Environment (blend spec name) of a rollout collected step by step."""
ALL_ENVS = "_all"
"""Key of the all-environments roll-up in every file."""
ALL_ENVS_LABEL = "(all)"
"""How tables print the roll-up."""
PASS_THRESHOLD = 1.0
USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens")
NG_PERF = "ng_perf"
"""NeMo Gym 0.7's per-rollout performance record (latency, turns, tokens) on a rollout row."""
TASK_ID = "task_id"
TASK_INPUT = "task_input"
"""A materialized task row (NeMo Gym 0.7) is ``{task_id: {taskset, task_id}, task_input: {...}}``."""
ENVIRONMENT_SERVER = "_ng_environment_server"
"""The environment server a materialized task row is routed to, stamped on the row and its result."""
RESULT_TYPE = "_ng_result_type"
"""The implementation of that environment server (``single_agent_turn``), stamped on the result."""
NG_TASK_ID = "_ng_task_id"
"""The episode's ``task_id`` as the environment server answered it, stamped on the result."""


NG_FAILURE_PREFIX = "_ng_failure_"
"""NeMo Gym 0.7's failure diagnostics on a row (``_ng_failure_class``, ``_ng_failure_message``, ...)."""
NG_FAILURE_CLASS = f"{NG_FAILURE_PREFIX}class"
NG_FAILURE_TYPE = f"{NG_FAILURE_PREFIX}type"
NG_FAILURE_MESSAGE = f"{NG_FAILURE_PREFIX}message"
NG_FAILURE_HTTP_STATUS = f"{NG_FAILURE_PREFIX}http_status"
NG_FAILURE_TERMINAL = f"{NG_FAILURE_PREFIX}terminal"
FAILURE_CLASS_FIELDS = ("error_class", NG_FAILURE_CLASS)
"""Where a failure says what kind it is: polygym's ``_failures.jsonl`` field, then NeMo Gym's."""


def failure_class(record: Mapping[str, Any]) -> str:
    """The class of a failure record of either project (``?`` when it names none)."""
    found = next((record[f] for f in FAILURE_CLASS_FIELDS if isinstance(record.get(f), str)), "?")
    return str(found)


def carried(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``CARRIED_FIELDS`` of ``row`` that it has."""
    return {key: row[key] for key in CARRIED_FIELDS if key in row}


def materialized_taskset(row: Mapping[str, Any]) -> str | None:
    """The taskset of a materialized task row, as NeMo Gym 0.7 tells one apart: ``task_id`` is an
    object and ``task_input`` is present (None for any other row, or a taskset that is no name)."""
    task_id = row.get(TASK_ID)
    if not isinstance(task_id, Mapping) or TASK_INPUT not in row:
        return None
    taskset = task_id.get("taskset")
    return taskset if isinstance(taskset, str) and taskset else None


def is_materialized(row: Mapping[str, Any]) -> bool:
    """Whether a row has the materialized-task shape, valid or not (NeMo Gym's routing test)."""
    return isinstance(row.get(TASK_ID), Mapping) and TASK_INPUT in row


def env_label(env: str) -> str:
    """How a table or message names an environment key (the roll-up as ``ALL_ENVS_LABEL``)."""
    return ALL_ENVS_LABEL if env == ALL_ENVS else env


def reward(rollout: Mapping[str, Any]) -> float:
    """The rollout's reward as a float (see the module docstring for booleans and bad values)."""
    value = rollout.get("reward")
    if not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def usage(rollout: Mapping[str, Any]) -> dict[str, float]:
    """The numeric token counts of the rollout's ``response.usage`` (absent ones left out)."""
    response = rollout.get("response")
    counts = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(counts, dict):
        return {}
    return {
        key: float(counts[key])
        for key in USAGE_FIELDS
        if isinstance(counts.get(key), int | float) and not isinstance(counts[key], bool)
    }


def total_tokens(rollout: Mapping[str, Any]) -> int:
    """``response.usage.total_tokens`` (0 when the response does not say)."""
    return int(usage(rollout).get("total_tokens", 0))


@dataclass
class Job:
    """One rollout to collect: the row as sent to the agent, with indices and routing."""

    agent: str
    task_index: int
    rollout_index: int
    row: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_index, self.rollout_index)


def make_job(
    data: Mapping[str, Any],
    agent: str,
    task: int,
    rollout: int,
    sampling: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> Job:
    """The job for repeat ``rollout`` of dataset row ``data``, routed to ``agent``.

    ``sampling`` overrides the row's sampling fields (``--temperature``...); ``seed`` gives repeat
    ``r`` the request seed ``seed + r``, so repeats differ and a rerun reproduces each of them.
    A materialized task row goes to the environment server ``agent`` as it is, stamped with that
    server as NeMo Gym 0.7 stamps it (it has no ``responses_create_params`` of its own to change).
    """
    if is_materialized(data):
        episode = {**data, ENVIRONMENT_SERVER: agent, TASK_INDEX: task, ROLLOUT_INDEX: rollout}
        return Job(agent, task, rollout, episode)
    params = {**data["responses_create_params"], **(sampling or {})}
    if seed is not None:
        params["seed"] = seed + rollout
    row = {
        **data,
        "responses_create_params": params,
        "agent_ref": {"type": AGENT_KIND, "name": agent},
        TASK_INDEX: task,
        ROLLOUT_INDEX: rollout,
    }
    return Job(agent, task, rollout, row)
