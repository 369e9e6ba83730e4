"""Dataset rows: reading JSONL, validating every row up front, and materializing rollout jobs.

Validation runs before anything is sent, over the whole file, so a typo on line 9,000 is found in
a second rather than after an hour of collection; each problem reads ``file:line: field: problem``.
The rows that pass become a ``JobPlan`` (``polygym.collect.job_plan``): rows x repeats with NeMo
Gym's indices, expanded one job at a time as the collector takes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from polygym.collect.job_plan import JobPlan, Materialization
from polygym.collect.sampling import sampling_problems
from polygym.collect.task_source import TASK_SOURCE, TaskRoutes
from polygym.errors import DatasetError
from polygym.jsonl import numbered_lines
from polygym.kinds import AGENT_KIND, ENVIRONMENT_ROUTES
from polygym.row import TASK_ID, TASK_INPUT, is_materialized, materialized_taskset
from polygym.suggest import unknown_name_message

INPUT_ITEM_KEYS = ("role", "type")


@dataclass
class Row:
    """One dataset row and where it came from."""

    data: dict[str, Any]
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a dataset (missing, or a folder), or None."""
    if path.is_dir():
        return f"{path}: is a directory, not a JSONL file"
    if not path.is_file():
        return f"{path}: no such file"
    return None


def read_rows(path: Path, problems: list[str], limit: int | None = None) -> list[Row]:
    """Parse a JSONL file; blank lines are skipped, unparsable lines become problems."""
    rows: list[Row] = []
    unreadable = file_problem(path)
    if unreadable is not None:
        problems.append(unreadable)
        return rows
    for number, raw in numbered_lines(path):
        if limit is not None and len(rows) >= limit:
            break
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(f"{path}:{number}: (row): invalid JSON: {exc}")
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}:{number}: (row): must be a JSON object, got {type(data).__name__}")
            continue
        rows.append(Row(data, str(path), number))
    return rows


def _check_input(where: str, value: Any, problems: list[str]) -> None:
    """A string or a list of input items; an empty list is valid, as NeMo Gym accepts it.

    Rows whose prompt comes from elsewhere (``instructions``, or an environment that builds the
    first observation in ``/seed_session``) carry ``input: []``, and NeMo Gym datasets ship them.
    """
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        problems.append(
            f"{where}: responses_create_params.input: must be a string or a list of items, "
            f"got {type(value).__name__}"
        )
        return
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not any(k in item for k in INPUT_ITEM_KEYS):
            problems.append(
                f"{where}: responses_create_params.input[{i}]: must be an object with 'role' or 'type'"
            )


def _check_tools(where: str, value: Any, problems: list[str]) -> None:
    if not isinstance(value, list):
        problems.append(f"{where}: responses_create_params.tools: must be a list")
        return
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("name", tool.get("type")), str):
            problems.append(f"{where}: responses_create_params.tools[{i}]: must be an object with a 'name'")


def check_task(row: Row, problems: list[str]) -> None:
    """A materialized task's envelope (NeMo Gym's ``TaskId`` and an object of task input); what the
    input holds is the environment server's to check when it runs."""
    task_id = row.data[TASK_ID]
    for key in ("taskset", "task_id"):
        if not isinstance(task_id.get(key), str) or not task_id[key]:
            problems.append(f"{row.where}: {TASK_ID}.{key}: must be a non-empty string")
    if not isinstance(row.data[TASK_INPUT], dict):
        problems.append(f"{row.where}: {TASK_INPUT}: must be an object")


def check_row(row: Row, problems: list[str]) -> None:
    """Shape checks every agent relies on; environment-specific fields are checked by verify."""
    if is_materialized(row.data):
        check_task(row, problems)
        return
    params = row.data.get("responses_create_params")
    if params is None:
        problems.append(f"{row.where}: responses_create_params: missing")
        return
    if not isinstance(params, dict):
        problems.append(f"{row.where}: responses_create_params: must be an object")
        return
    if "input" not in params:
        problems.append(f"{row.where}: responses_create_params.input: missing")
    else:
        _check_input(row.where, params["input"], problems)
    if "tools" in params:
        _check_tools(row.where, params["tools"], problems)
    for name, problem in sampling_problems(params):
        problems.append(f"{row.where}: responses_create_params.{name}: {problem}")


def agent_of(
    row: Row,
    default_agent: str | None,
    agents: Iterable[str],
    problems: list[str],
    routes: TaskRoutes | None = None,
) -> str | None:
    """The agent a row is routed to: its ``agent_ref`` name, else the agent its ``task_source``
    resolves to in the running config (``routes``; NeMo Gym's newer rows), else the default agent.
    A materialized task row goes to the environment server its taskset routes to instead."""
    if is_materialized(row.data):
        return environment_server_of(row, routes, problems)
    known = set(agents)
    ref = row.data.get("agent_ref")
    source = row.data.get(TASK_SOURCE)
    if ref is None and source is not None and routes is not None:
        agent = routes.agent_for(source) if isinstance(source, str) else None
        if agent is None:
            why = routes.why_not(source) if isinstance(source, str) else "must be an instance name"
            problems.append(f"{row.where}: {TASK_SOURCE} {source!r}: cannot route: {why}")
        elif known and agent not in known:
            problems.append(
                f"{row.where}: {TASK_SOURCE} {source!r}: {unknown_name_message('agent', agent, known)}"
            )
            return None
        return agent
    if ref is None:
        if default_agent is None:
            problems.append(
                f"{row.where}: agent_ref: missing, and no --agent default given (running: "
                f"{', '.join(sorted(known)) or 'none'})"
            )
        return default_agent
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        problems.append(f'{row.where}: agent_ref: must be {{"type": "{AGENT_KIND}", "name": ...}}')
        return None
    if ref.get("type", AGENT_KIND) != AGENT_KIND:
        problems.append(f"{row.where}: agent_ref.type: must be '{AGENT_KIND}', got {ref.get('type')!r}")
        return None
    if known and ref["name"] not in known:
        problems.append(f"{row.where}: agent_ref.name: {unknown_name_message('agent', ref['name'], known)}")
        return None
    return ref["name"]


def environment_server_of(row: Row, routes: TaskRoutes | None, problems: list[str]) -> str | None:
    """The environment server of a materialized task row: ``environment_server_routes[taskset]``."""
    taskset = materialized_taskset(row.data)
    if taskset is None:
        return None  # check_task named the problem
    server = routes.tasksets.get(taskset) if routes is not None else None
    if server is None:
        why = routes.why_no_route(taskset) if routes is not None else f"no {ENVIRONMENT_ROUTES}"
        problems.append(f"{row.where}: {TASK_ID}.taskset {taskset!r}: cannot route: {why}")
    return server


def load_jobs(
    path: Path,
    agents: Iterable[str],
    default_agent: str | None = None,
    limit: int | None = None,
    options: Materialization | None = None,
    routes: TaskRoutes | None = None,
) -> JobPlan:
    """Read and validate a dataset, and plan its jobs; raises DatasetError listing every bad row.
    ``routes`` resolves rows that carry a ``task_source`` and no ``agent_ref``."""
    problems: list[str] = []
    known = list(agents)
    rows = read_rows(path, problems, limit)
    routed: list[tuple[dict[str, Any], str]] = []
    options = options or Materialization()
    for row in rows:
        check_row(row, problems)
        agent = agent_of(row, default_agent, known, problems, routes)
        if agent is not None:
            routed.append((row.data, agent))
    tasks = [row for row in rows if is_materialized(row.data)]
    if tasks and (options.sampling or options.seed is not None):
        problems.append(
            f"{tasks[0].where}: materialized task rows take no sampling overrides nor --seed "
            "(their task_input is the environment server's; NeMo Gym refuses them too)"
        )
    if not rows and not problems:
        problems.append(f"{path}: no rows")
    if problems:
        raise DatasetError(problems)
    plan = JobPlan.from_rows(routed, options)
    plan.result_types = dict(routes.result_types) if routes is not None else {}
    return plan
