"""Blends: a spec resolved against the environments it names, with their rows.

``resolve`` joins each ``EnvironmentSpec`` of a spec (what the user wants from an environment) with
the ``Environment`` that serves it (``polygym.stack.environment``, which alone reads an
environment's config and resolves its dataset paths): which agent runs its rows and which files
hold them. ``load_blend`` then reads and checks the rows (their shape, and the fields their
verifier needs, ``polygym.blend.validate``); the ``Blend`` it returns is everything needed to plan,
sample, write and collect.

Rows are routed by stamping ``agent_ref`` on each, exactly as the hand-written recipe
``jq -c '. + {"agent_ref": {"type": "responses_api_agents", "name": "<env>_simple_agent"}}'``
does: an existing ``agent_ref`` is replaced in place, every other field is kept as is.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polygym.blend.planner import DEFAULT_WARN_BELOW, Plan
from polygym.blend.sampler import StepSampler
from polygym.blend.spec import BlendSpec, BlendSpecError, EnvironmentSpec
from polygym.blend.validate import check_verifier_fields, verifier_for
from polygym.collect.dataset import DatasetError, Row, check_row, read_rows
from polygym.kinds import AGENT_KIND
from polygym.row import is_materialized
from polygym.stack.config import ConfigError
from polygym.stack.environment import (
    Environment,
    EnvironmentNotFoundError,
    Split,
    find_file,
    load_environment,
)
from polygym.suggest import unknown_name_message

Order = Literal["concat", "shuffled", "steps"]
ORDERS: tuple[str, ...] = ("concat", "shuffled", "steps")

TASKS_NOT_BLENDED = (
    "a materialized task row (task_id + task_input) goes to the environment server its taskset "
    "routes to, which a blend environment (an agent) is not: collect it with gym eval run"
)


@dataclass
class Member:
    """One environment of a blend: the spec's entry joined with the ``Environment`` serving it.

    ``environment`` is None for an environment without a config of its own, which a spec may name
    when it gives the data files (its servers then come from the user's ``--config``).
    """

    spec: EnvironmentSpec
    environment: Environment | None
    agent: str
    train: list[Path]
    validation: list[Path]

    @property
    def name(self) -> str:
        return self.spec.name

    def files(self, split: Split) -> list[Path]:
        return self.train if split == "train" else self.validation


def _given_files(
    spec: BlendSpec, where: str, entry: EnvironmentSpec, split: Split, problems: list[str]
) -> list[Path]:
    """The files the spec names for ``split``: relative to the spec's folder, then the working directory."""
    roots = list(dict.fromkeys((spec.base_dir, Path.cwd())))
    found = []
    for j, text in enumerate(getattr(entry, split)):
        path = find_file(text, roots)
        if path is None:
            looked = ", ".join(str(root) for root in roots)
            problems.append(f"{where}.{split}[{j}]: file not found: {text} (looked in {looked})")
        else:
            found.append(path)
    return found


def _configured_files(
    where: str, environment: Environment, agent: str, split: Split, problems: list[str]
) -> list[Path]:
    """The files of the datasets ``agent``'s config lists for ``split``."""
    datasets = environment.split_datasets(agent, split)
    if split == "train" and not datasets:
        problems.append(
            f"{where}.train: none given and {environment.config_path} lists no datasets for {agent}"
        )
    found = []
    for dataset in datasets:
        path = environment.find_dataset(dataset)
        if path is None:
            looked = ", ".join(str(root) for root in environment.dataset_roots)
            problems.append(
                f"{where}.{split}: dataset '{dataset.name or '?'}' of {environment.config_path} not found: "
                f"{dataset.jsonl_fpath} (looked in {looked})"
            )
        else:
            found.append(path)
    return found


def _member(spec: BlendSpec, index: int, entry: EnvironmentSpec, problems: list[str]) -> Member | None:
    """Resolve one entry of ``spec`` (None after recording why it cannot be)."""
    where = f"{spec.source}: environments[{index}] ({entry.name})"
    environment: Environment | None = None
    try:
        environment = load_environment(entry.name)
    except EnvironmentNotFoundError as exc:
        if not entry.train:
            problems.append(f"{where}: no train files given and {'; '.join(exc.problems)}")
            return None
    except ConfigError as exc:
        problems.extend(f"{where}: {problem}" for problem in exc.problems)
        return None
    agent = entry.agent or (environment.default_agent() if environment else None) or entry.agent_name
    if environment is not None and agent not in environment.agents:
        problems.append(f"{where}.agent: {unknown_name_message('agent', agent, list(environment.agents))}")
        return None
    files: dict[Split, list[Path]] = {"train": [], "validation": []}
    for split in files:
        if split == "train" and entry.eval_only:
            continue  # never trained: its config need not list training data
        if getattr(entry, split):
            files[split] = _given_files(spec, where, entry, split, problems)
        elif environment is not None:
            files[split] = _configured_files(where, environment, agent, split, problems)
    return Member(entry, environment, agent, files["train"], files["validation"])


def resolve(spec: BlendSpec) -> list[Member]:
    """Find every environment's agent and data files; raises BlendSpecError with every problem."""
    problems: list[str] = []
    members = [_member(spec, i, entry, problems) for i, entry in enumerate(spec.environments)]
    if problems:
        raise BlendSpecError(problems)
    return [member for member in members if member is not None]


def stamp(data: dict[str, Any], agent: str) -> dict[str, Any]:
    """The row with ``agent_ref`` set (replaced in place when present, appended otherwise)."""
    return {**data, "agent_ref": {"type": AGENT_KIND, "name": agent}}


@dataclass
class Blend:
    """A resolved spec with its rows: everything needed to plan, sample, blend and collect."""

    spec: BlendSpec
    environments: list[Member]
    rows: dict[str, list[Row]]
    split: Split = "train"

    def agent(self, env: str) -> str:
        return next(e.agent for e in self.environments if e.name == env)

    def stamped(self, env: str) -> list[dict[str, Any]]:
        agent = self.agent(env)
        return [stamp(row.data, agent) for row in self.rows[env]]

    def plan(self, warn_below: int = DEFAULT_WARN_BELOW) -> Plan:
        return self.spec.plan({env: len(rows) for env, rows in self.rows.items()}, warn_below)

    def sampler(self, plan: Plan | None = None) -> StepSampler:
        """A sampler over the stamped rows (``StepItem.row`` is the row as sent, with agent_ref)."""
        return StepSampler(
            plan or self.plan(), {e.name: self.stamped(e.name) for e in self.environments}, self.spec.seed
        )

    def ordered(self, order: Order, steps: int | None = None) -> Iterator[dict[str, Any]]:
        """Stamped rows in ``concat`` (spec then file order), ``shuffled`` (by the seed) or
        ``steps`` order (the sampler's steps 0..steps-1; default: until every row was used)."""
        if order == "concat":
            for env in self.environments:
                yield from self.stamped(env.name)
        elif order == "shuffled":
            rows = [row for env in self.environments for row in self.stamped(env.name)]
            random.Random(self.spec.seed).shuffle(rows)
            yield from rows
        elif order == "steps":
            sampler = self.sampler()
            count = sampler.steps_to_cover() if steps is None else steps
            for step in sampler.steps(0, count):
                for item in step.items:
                    yield item.row
        else:
            raise ValueError(f"unknown order '{order}'; choose one of {', '.join(ORDERS)}")


def load_blend(spec: BlendSpec, split: Split = "train", check_verifiers: bool = True) -> Blend:
    """Resolve ``spec`` and read every row of ``split``; raises DatasetError listing bad rows."""
    members = resolve(spec)
    problems: list[str] = []
    rows: dict[str, list[Row]] = {}
    for env in members:
        verifier = verifier_for(env.environment, env.agent) if check_verifiers and env.environment else None
        if verifier is not None and verifier.problem:
            problems.append(f"{spec.source}: environments ({env.name}): {verifier.problem}")
        env_rows: list[Row] = []
        watched = split == "train" and env.spec.eval_only
        if watched and not env.files("validation"):
            problems.append(f"{spec.source}: environments ({env.name}): eval_only but no validation rows")
        for path in [] if watched else env.files(split):
            for row in read_rows(path, problems):
                if is_materialized(row.data):
                    problems.append(f"{row.where}: {TASKS_NOT_BLENDED}")
                    continue
                check_row(row, problems)
                if verifier is not None:
                    check_verifier_fields(row, verifier, problems)
                env_rows.append(row)
        if split == "train" and not watched and not env_rows:
            problems.append(f"{spec.source}: environments ({env.name}): no training rows")
        rows[env.name] = env_rows
    if problems:
        raise DatasetError(problems)
    return Blend(spec, members, rows, split)
