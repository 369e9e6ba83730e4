"""Materialized task rows as NeMo Gym 0.7's environment servers take them: one episode per ``/run``.

A row ``{task_id: {taskset, task_id}, task_input: {...}}`` is sent to the environment server its
taskset routes to (``environment_server_routes``, resolved in ``collect.task_source``) in NeMo Gym's
episode envelope, and the server's reply (a result, or a typed failure) is turned into the record
NeMo Gym's collector stores. Matched to NeMo Gym 0.7.0's ``nemo_gym/rollout_collection.py``
(``_episode_request_body``, ``_is_episode_response``, ``_episode_record``) and
``nemo_gym/episode_types.py`` (``EpisodeId``, ``BaseEpisodeResponse``, ``EpisodeFailure``):

* the request is ``{episode_id: {rollout_id, attempt}, task: {task_id, task_input}}``; the rollout
  id is the row's ``_ng_rollout_id``, else ``"<task index>-<rollout index>"``, and the attempt is
  its ``_ng_attempt_index`` (0 on a first attempt), so a retry is the same rollout's next attempt;
* a reply ``{episode_id, task_id, result}`` is stored as the result it carries, stamped with
  ``_ng_task_id``, ``_ng_environment_server`` and ``_ng_result_type`` (the server's implementation);
  its score is the result's top-level ``reward``, as NeMo Gym scores every environment server;
* a reply ``{..., failure: {failure_reason, terminal, stage?, partial_response?}}`` is a failure of
  class ``environment_server_failed`` with NeMo Gym's ``_ng_failure_*`` keys, never a reward: it
  goes to the failures file, and a terminal one is not run again by ``--resume``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polygym.row import (
    ATTEMPT_INDEX,
    ENVIRONMENT_SERVER,
    NG_FAILURE_CLASS,
    NG_FAILURE_MESSAGE,
    NG_FAILURE_PREFIX,
    NG_FAILURE_TERMINAL,
    NG_PERF,
    NG_TASK_ID,
    RESULT_TYPE,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    TASK_ID,
    TASK_INDEX,
    TASK_INPUT,
)

ENVIRONMENT_SERVER_FAILED = "environment_server_failed"
"""NeMo Gym 0.7's failure class of an episode its environment server answered with a failure."""
EPISODE_STAMPS = (ENVIRONMENT_SERVER, RESULT_TYPE, NG_TASK_ID)
"""What the collector stamps on an episode's record, a failure's included."""
_COLLECTOR_KEYS = ("ng_trajectory", "ng_model_call_capture", NG_PERF)


def episode_request(row: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo Gym's episode envelope for one job of a materialized row."""
    attempt = row.get(ATTEMPT_INDEX, 0)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise ValueError(f"invalid episode attempt: {attempt!r}")
    explicit = row.get(ROLLOUT_ID)
    rollout_id = explicit if isinstance(explicit, str) else f"{row[TASK_INDEX]}-{row[ROLLOUT_INDEX]}"
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": attempt},
        "task": {TASK_ID: row[TASK_ID], TASK_INPUT: row[TASK_INPUT]},
    }


def is_episode_response(reply: Any) -> bool:
    """A ``BaseEpisodeResponse``-shaped reply: identities plus a ``result`` or a ``failure``."""
    return (
        isinstance(reply, Mapping)
        and isinstance(reply.get("episode_id"), Mapping)
        and isinstance(reply.get(TASK_ID), Mapping)
        and ("result" in reply or "failure" in reply)
    )


def episode_record(reply: Any, server: str, result_type: str | None) -> Any:
    """The record of an environment server's reply: its result or its failure, stamped as NeMo
    Gym's collector stamps them. A reply of another shape is returned as it is (NeMo Gym stores it
    unchanged too; without a ``reward`` the collector records it as a failure)."""
    if not is_episode_response(reply):
        return reply
    failure = reply.get("failure")
    record = _failure_record(reply, failure) if failure is not None else _result_record(reply)
    record[ENVIRONMENT_SERVER] = server
    if result_type is not None:
        record[RESULT_TYPE] = result_type
    return record


def _failure_record(reply: Mapping[str, Any], failure: Any) -> dict[str, Any]:
    if not isinstance(failure, Mapping):
        raise ValueError(f"environment server reply for task {reply[TASK_ID]!r} carries a non-object failure")
    record: dict[str, Any] = {
        NG_TASK_ID: reply[TASK_ID],
        NG_FAILURE_CLASS: ENVIRONMENT_SERVER_FAILED,
        NG_FAILURE_TERMINAL: bool(failure.get("terminal", False)),
        NG_FAILURE_MESSAGE: failure.get("failure_reason"),
    }
    for key in ("stage", "partial_response"):
        if failure.get(key) is not None:
            record[f"{NG_FAILURE_PREFIX}{key}"] = failure[key]
    return record


def _result_record(reply: Mapping[str, Any]) -> dict[str, Any]:
    result = reply.get("result")
    if not isinstance(result, Mapping):
        raise ValueError(f"environment server reply for task {reply[TASK_ID]!r} carries a non-object result")
    reserved = sorted(key for key in result if key.startswith("_ng_") or key in _COLLECTOR_KEYS)
    if reserved:
        raise ValueError(
            f"environment server result for task {reply[TASK_ID]!r} uses keys reserved for rollout "
            f"collection: {reserved}"
        )
    return {**result, NG_TASK_ID: reply[TASK_ID]}
