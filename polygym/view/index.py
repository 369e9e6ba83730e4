"""A compact, growing index of one run's rollouts and failures: a few columns per row.

A 100,000-rollout file can be gigabytes of conversations; a page shows twenty of them. So the
index keeps, per row, only what filters, tables and statistics need (environment, reward, failed,
failure class, task, tokens, turns) and where the row lies on disk (file, byte offset,
length); ``row(i)`` reads one row back when a page needs it. Rows are numbered in file order,
rollouts first as they are read, failures as they are read, so a row's number never changes while
the run grows; if a file is started over the index is rebuilt (``generation`` changes).

The environment of a row is its ``_pg_env`` (step-wise runs, the names of the blend and the step
log) or else its agent's name (one agent = one environment). ``task_key`` names the task by its
prompt (a digest of ``responses_create_params.input`` and the environment), so two runs over the
same data can be paired task by task even when their task indices differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym.row import (
    ENV_FIELD,
    ROLLOUT_INDEX,
    STEP_FIELD,
    TASK_INDEX,
    failure_class,
    reward,
    total_tokens,
)
from polygym.view.conversation import count_turns
from polygym.view.runs import RunSource
from polygym.view.tail import JsonlTail, read_at

ROLLOUTS, FAILURES = 0, 1


def env_of(row: Mapping[str, Any]) -> str:
    env = row.get(ENV_FIELD)
    if isinstance(env, str):
        return env
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else "?"


def task_key(env: str, row: Mapping[str, Any]) -> str:
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, Mapping) else None
    digest = hashlib.blake2b(env.encode(), digest_size=8)
    digest.update(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()


def _int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass
class RunIndex:
    source: RunSource
    envs: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    file: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    env: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    failure_class: list[int] = field(default_factory=list)
    """Index into ``classes``; -1 for a rollout that did not fail."""
    task: list[int] = field(default_factory=list)
    repeat: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    task_key: list[str] = field(default_factory=list)
    generation: int = 0
    _tails: list[JsonlTail] = field(default_factory=list, repr=False)
    _codes: dict[str, int] = field(default_factory=dict, repr=False)
    _class_codes: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._tails = [JsonlTail(self.source.rollouts), JsonlTail(self.source.failures)]

    def __len__(self) -> int:
        return len(self.file)

    @property
    def skipped(self) -> int:
        """Lines left out for being too long."""
        return sum(t.skipped for t in self._tails)

    def path(self, i: int) -> Path:
        return self.source.rollouts if self.file[i] == ROLLOUTS else self.source.failures

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as written (a failure record for a failed row)."""
        data = orjson.loads(read_at(self.path(i), self.offset[i], self.length[i]))
        return data if isinstance(data, dict) else {}

    def raw(self, i: int) -> bytes:
        return read_at(self.path(i), self.offset[i], self.length[i])

    def refresh(self) -> int:
        """Index the rows written since the last refresh; returns how many were added."""
        before = len(self)
        generations = [t.generation for t in self._tails]
        lines = [list(t.read_new()) for t in self._tails]
        if [t.generation for t in self._tails] != generations:
            self._reset()
            return self.refresh()
        for which, new in enumerate(lines):
            for line in new:
                try:
                    data = orjson.loads(line.raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(data, dict):
                    self._add(which, line.offset, len(line.raw), data)
        return len(self) - before

    def _reset(self) -> None:
        source, generation = self.source, self.generation + 1
        self.__init__(source)  # type: ignore[misc]
        self.generation = generation

    def _code(self, env: str) -> int:
        code = self._codes.get(env)
        if code is None:
            code = self._codes[env] = len(self.envs)
            self.envs.append(env)
        return code

    def _class_code(self, name: str) -> int:
        code = self._class_codes.get(name)
        if code is None:
            code = self._class_codes[name] = len(self.classes)
            self.classes.append(name)
        return code

    def _add(self, which: int, offset: int, length: int, data: dict[str, Any]) -> None:
        failed = which == FAILURES
        inner = data.get("row")
        row: dict[str, Any] = inner if failed and isinstance(inner, dict) else data
        env = row[ENV_FIELD] if isinstance(row.get(ENV_FIELD), str) else env_of(data)
        self.file.append(which)
        self.offset.append(offset)
        self.length.append(length)
        self.env.append(self._code(env))
        self.reward.append(0.0 if failed else reward(data))
        self.failed.append(failed)
        self.failure_class.append(self._class_code(failure_class(data)) if failed else -1)
        self.task.append(_int(data.get(TASK_INDEX)))
        self.repeat.append(_int(data.get(ROLLOUT_INDEX)))
        self.step.append(_int(row.get(STEP_FIELD)))
        self.tokens.append(0 if failed else total_tokens(data))
        self.turns.append(0 if failed else count_turns(data.get("response")))
        self.task_key.append(task_key(env, row))


def open_index(source: RunSource) -> RunIndex:
    index = RunIndex(source)
    index.refresh()
    return index
