"""Checking dataset rows against the verifiers of the environments they target.

A row can be well formed and still useless: a verifier that requires ``expected_city`` fails on
every rollout of a row without it, an hour into collection. So rows are checked with the
verifier's own request model before anything runs, by ``gym data validate`` (``validate_files``)
and by every blend load (``polygym.blend.mix.load_blend``), with per-environment counts of rows,
tools, turns and estimated tokens.

A NeMo Gym server (``polygym.stack.nemo_gym_server``) is never imported here: it needs its own
Python environment (fastapi, nemo_gym, its requirements), which polygym's process does not have.
Its rows get the generic checks only, and the report says that its server checks the rest when
the rollouts run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from polygym.collect.dataset import Row, agent_of, check_row, file_problem, read_rows
from polygym.collect.sampling import SAMPLING_FIELDS
from polygym.collect.task_source import TASK_SOURCE, TaskRoutes, task_routes
from polygym.kinds import RESOURCES_KIND
from polygym.row import is_materialized
from polygym.servers.base import body_model
from polygym.stack.catalog import list_implementations
from polygym.stack.config import ConfigError
from polygym.stack.environment import (
    Environment,
    EnvironmentNotFoundError,
    all_environments,
    load_environment,
    load_server_class,
)
from polygym.stack.nemo_gym_server import is_nemo_gym_server
from polygym.suggest import unknown_name_message

ROLLOUT_FIELDS = frozenset({"response"})
"""Verify-request fields a rollout adds; a dataset row never carries them."""
CHARS_PER_TOKEN = 4

CHECKED_PARAMS = frozenset({"input", "tools", *SAMPLING_FIELDS})
"""Fields of ``responses_create_params`` that ``dataset.check_row`` checks (reported once, by it)."""


@dataclass
class Verifier:
    """What the verifier of one agent's environment needs from a row."""

    env: str
    model: type[BaseModel] | None
    required: list[str]
    problem: str | None = None
    note: str | None = None
    """Why the rows were not checked against the verifier's model, when that is no problem."""


def verifier_for(env: Environment, agent: str) -> Verifier:
    """The verify request model of ``agent``'s resources server and its required row fields."""
    server = env.resources_server_of(agent)
    if server is None:
        return Verifier(env.name, None, [], f"{agent} refers to no resources server in {env.config_path}")
    if is_nemo_gym_server(server):
        note = (
            f"{agent}: {server.name} is a NeMo Gym server: its rows got the generic checks only "
            "(responses_create_params, agent_ref); its own row schema is checked by the server at run time"
        )
        return Verifier(env.name, None, [], note=note)
    try:
        cls = load_server_class(server)
    except ConfigError as exc:  # a broken app.py is reported, the other rows are still checked
        problem = f"cannot load resources server {server.name}: {'; '.join(exc.problems)}"
        return Verifier(env.name, None, [], problem)
    model = body_model(cls.verify) if hasattr(cls, "verify") else None
    if model is None:
        return Verifier(env.name, None, [])
    required = [
        name for name, info in model.model_fields.items() if info.is_required() and name not in ROLLOUT_FIELDS
    ]
    return Verifier(env.name, model, required)


def check_verifier_fields(row: Row, verifier: Verifier, problems: list[str]) -> None:
    """Fields the verifier requires, and their types, checked with its own request model."""
    if verifier.model is None:
        return
    data = {"response": {}, **{k: v for k, v in row.data.items() if k not in ROLLOUT_FIELDS}}
    try:
        verifier.model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(err.get("loc", ()))
            if not loc or loc[0] in ROLLOUT_FIELDS:
                continue
            if loc[0] == "responses_create_params" and (len(loc) < 2 or loc[1] in CHECKED_PARAMS):
                continue  # shape and sampling problems already reported by dataset.check_row
            key = ".".join(str(p) for p in loc)
            if err.get("type") == "missing":
                problems.append(f"{row.where}: {key}: missing (required by the {verifier.env} verifier)")
            else:
                problems.append(f"{row.where}: {key}: {err.get('msg', 'invalid')} ({verifier.env} verifier)")


@dataclass
class EnvStats:
    """Per-environment counts of a checked dataset (tokens estimated as characters / 4)."""

    env: str
    agent: str
    rows: int = 0
    tools: set[str] = field(default_factory=set)
    turns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, data: dict[str, Any]) -> None:
        params = data.get("responses_create_params")
        params = params if isinstance(params, dict) else {}
        self.rows += 1
        for tool in params.get("tools") or []:
            if isinstance(tool, dict):
                self.tools.add(str(tool.get("name", tool.get("type"))))
        prompt = params.get("input")
        self.turns.append(1 if isinstance(prompt, str) else len(prompt) if isinstance(prompt, list) else 0)
        chars = len(orjson.dumps(prompt)) + len(orjson.dumps(params.get("tools") or []))
        self.tokens.append(math.ceil(chars / CHARS_PER_TOKEN))

    def to_dict(self) -> dict[str, Any]:
        def spread(values: list[int]) -> dict[str, float]:
            if not values:
                return {"min": 0, "mean": 0.0, "max": 0}
            return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}

        return {
            "env": self.env,
            "agent": self.agent,
            "rows": self.rows,
            "tools": sorted(self.tools),
            "turns": spread(self.turns),
            "est_tokens": spread(self.tokens),
        }


@dataclass
class ValidationReport:
    problems: list[str]
    stats: list[EnvStats]
    rows: int
    notes: list[str] = field(default_factory=list)
    """What was not checked and why (e.g. NeMo Gym servers' own row schemas)."""


def _selected(envs: Sequence[str], problems: list[str]) -> dict[str, Environment]:
    """Every loadable environment, or only those named: loaded by name, since a NeMo Gym root
    holds some 150 and loading them all takes seconds. An unknown name is a problem with a
    suggestion; a named environment whose config does not load is one with the config's problems."""
    if not envs:
        return all_environments()
    selected: dict[str, Environment] = {}
    for name in envs:
        try:
            selected[name] = load_environment(name)
        except EnvironmentNotFoundError as exc:
            known = list_implementations(RESOURCES_KIND)
            if name in known:  # the folder exists: say what is missing in it, not "did you mean"
                problems.append(f"--env {name}: {'; '.join(exc.problems)}")
            else:
                problems.append(f"--env {name}: {unknown_name_message('environment', name, known)}")
        except ConfigError as exc:
            problems.append(f"--env {name}: its config does not load: {'; '.join(exc.problems)}")
    return selected


def validate_files(paths: Sequence[Path], envs: Sequence[str] = ()) -> ValidationReport:
    """Check rows against the environments they target (all known ones, or only ``envs``).

    A row targets the environment whose config defines its ``agent_ref`` agent; with one ``env``
    given, rows without ``agent_ref`` target it.
    """
    problems: list[str] = []
    environments = _selected(envs, problems)
    agent_env = {agent: env for env in environments.values() for agent in env.agents}
    routes = TaskRoutes()  # rows that name their environment by task_source (NeMo Gym's newer rows)
    for env in environments.values():
        found = task_routes(env.config.to_dict())
        routes.agents.update(found.agents)
        routes.refused.update(found.refused)
    default_agent = None
    if len(envs) == 1 and envs[0] in environments:
        default_agent = environments[envs[0]].default_agent()
    verifiers: dict[str, Verifier] = {}
    stats: dict[str, EnvStats] = {}
    notes: list[str] = []
    total = tasks = 0
    for path in paths:
        unreadable = file_problem(path)
        if unreadable is not None:
            problems.append(unreadable)
            continue
        rows = read_rows(path, problems)
        if not rows:
            problems.append(f"{path}: no rows")
        for row in rows:
            total += 1
            check_row(row, problems)
            if is_materialized(row.data):
                tasks += 1  # routed by the taskset of the stack that runs it, not an environment here
                continue
            routed = row.data.get("agent_ref") is not None or row.data.get(TASK_SOURCE) is not None
            if not routed and default_agent is None:
                problems.append(
                    f"{row.where}: agent_ref: missing; add it, or pass --env NAME for rows of one environment"
                )
                continue
            agent = agent_of(row, default_agent, agent_env, problems, routes)
            if agent is None or agent not in agent_env:
                continue  # reported: unknown agent, or no usable --env was given
            env = agent_env[agent]
            if agent not in verifiers:
                verifiers[agent] = verifier_for(env, agent)
                if verifiers[agent].problem:
                    problems.append(f"{env.config_path}: {agent}: {verifiers[agent].problem}")
                if verifiers[agent].note:
                    notes.append(str(verifiers[agent].note))
            check_verifier_fields(row, verifiers[agent], problems)
            stats.setdefault(agent, EnvStats(env.name, agent)).add(row.data)
    if tasks:
        notes.append(
            f"{tasks} materialized task rows (task_id + task_input): their envelope was checked; the "
            "environment server their taskset routes to checks their task_input when it runs"
        )
    return ValidationReport(problems, list(stats.values()), total, notes)
