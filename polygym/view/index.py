"""A compact, growing index of one run's rollouts and failures: a few typed columns per row.

A 1,000,000-rollout file can be gigabytes of conversations; a page shows twenty of them. So the
index keeps, per row, only what filters, tables and statistics need (environment, reward, failed,
masked, failure class, task, tokens, turns) and where the row lies on disk (file, byte offset,
length), in ``array`` columns (about 75 bytes a row, not a Python object per value); ``row(i)``
reads one row back when a page needs it. Rows are numbered in file order, rollouts first as they
are read, failures as they are read, so a row's number never changes while the run grows; if a
file is started over the index is rebuilt (``generation`` changes).

The environment of a row is its ``_pg_env`` (step-wise runs, the names of the blend and the step
log) or else its agent's name (one agent = one environment). Its task is
``polygym.collect.compare.task_identity`` (``_ng_task_index``; the prompt for rows without one),
the identity ``gym eval run``'s metrics and ``gym eval compare`` use, so the viewer's numbers are
theirs; ``task_key`` names an (environment, task) pair in URLs by a short digest.

One thread writes an index (``refresh``, on the viewer's worker) while pages read it: ``len``
counts only rows whose every column is written, so a page never sees half a row.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym.collect.compare import TaskId, task_identity
from polygym.metrics import MASK_SAMPLE
from polygym.row import (
    ENV_FIELD,
    ROLLOUT_INDEX,
    STEP_FIELD,
    TASK_INDEX,
    failure_class,
    reward,
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


def task_key(env: str, task: TaskId) -> str:
    """A URL-safe name of one task of one environment."""
    return hashlib.blake2b(f"{env}\0{task}".encode(), digest_size=8).hexdigest()


@dataclass
class RunIndex:
    source: RunSource
    envs: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    tasks: list[tuple[int, TaskId]] = field(default_factory=list)
    """Task code -> (environment code, task identity)."""
    task_keys: list[str] = field(default_factory=list)
    """Task code -> its ``task_key``."""
    file: array[int] = field(default_factory=lambda: array("b"))
    offset: array[int] = field(default_factory=lambda: array("q"))
    length: array[int] = field(default_factory=lambda: array("q"))
    env: array[int] = field(default_factory=lambda: array("i"))
    reward: array[float] = field(default_factory=lambda: array("d"))
    failed: array[int] = field(default_factory=lambda: array("b"))
    masked: array[int] = field(default_factory=lambda: array("b"))
    """1: the verifier set ``mask_sample`` (left out of every quality number, as in the metrics file)."""
    failure_class: array[int] = field(default_factory=lambda: array("i"))
    """Index into ``classes``; -1 for a rollout that did not fail."""
    task: array[int] = field(default_factory=lambda: array("q"))
    """``_ng_task_index`` as written (-1: none), for display."""
    task_code: array[int] = field(default_factory=lambda: array("i"))
    repeat: array[int] = field(default_factory=lambda: array("q"))
    step: array[int] = field(default_factory=lambda: array("q"))
    tokens: array[int] = field(default_factory=lambda: array("q"))
    turns: array[int] = field(default_factory=lambda: array("i"))
    generation: int = 0
    loaded: bool = False
    """The files have been read to their end once."""
    count: int = 0
    _tails: list[JsonlTail] = field(default_factory=list, repr=False)
    _codes: dict[str, int] = field(default_factory=dict, repr=False)
    _class_codes: dict[str, int] = field(default_factory=dict, repr=False)
    _task_codes: dict[tuple[int, TaskId], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._tails = [JsonlTail(self.source.rollouts), JsonlTail(self.source.failures)]

    def __len__(self) -> int:
        return self.count

    @property
    def skipped(self) -> int:
        """Lines left out for being too long."""
        return sum(t.skipped for t in self._tails)

    def progress(self) -> tuple[int, int]:
        """(bytes read, bytes in the files): how far indexing has got."""
        done = sum(t.offset for t in self._tails)
        return done, max(done, sum(t.size() for t in self._tails))

    def path(self, i: int) -> Path:
        return self.source.rollouts if self.file[i] == ROLLOUTS else self.source.failures

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as written (a failure record for a failed row)."""
        data = orjson.loads(read_at(self.path(i), self.offset[i], self.length[i]))
        return data if isinstance(data, dict) else {}

    def raw(self, i: int) -> bytes:
        return read_at(self.path(i), self.offset[i], self.length[i])

    def task_key_of(self, i: int) -> str:
        return self.task_keys[self.task_code[i]]

    def refresh(self) -> int:
        """Index the rows written since the last refresh; returns how many were added."""
        before = len(self)
        generations = [t.generation for t in self._tails]
        for which, tail in enumerate(self._tails):
            for line in tail.read_new():
                try:
                    data = orjson.loads(line.raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(data, dict):
                    self._add(which, line.offset, len(line.raw), data)
        if [t.generation for t in self._tails] != generations:
            self._reset()
            return self.refresh()
        self.loaded = True
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

    def _task_code(self, env: int, identity: TaskId) -> int:
        task = (env, identity)
        code = self._task_codes.get(task)
        if code is None:
            code = self._task_codes[task] = len(self.tasks)
            self.tasks.append(task)
            self.task_keys.append(task_key(self.envs[env], task[1]))
        return code

    def _add(self, which: int, offset: int, length: int, data: dict[str, Any]) -> None:
        """One row's columns (a hot loop: a million rows are indexed while a person waits)."""
        failed = which == FAILURES
        inner = data.get("row")
        row: dict[str, Any] = inner if failed and isinstance(inner, dict) else data
        env_name = row.get(ENV_FIELD)
        env = self._code(env_name if isinstance(env_name, str) else env_of(data))
        index = data.get(TASK_INDEX)
        index = index if type(index) is int else -1
        repeat = data.get(ROLLOUT_INDEX)
        step = row.get(STEP_FIELD)
        self.file.append(which)
        self.offset.append(offset)
        self.length.append(length)
        self.env.append(env)
        self.failed.append(failed)
        self.task.append(index)
        self.task_code.append(self._task_code(env, index if index >= 0 else task_identity(row)))
        self.repeat.append(repeat if type(repeat) is int else -1)
        self.step.append(step if type(step) is int else -1)
        if failed:
            self.reward.append(0.0)
            self.masked.append(False)
            self.failure_class.append(self._class_code(failure_class(data)))
            self.tokens.append(0)
            self.turns.append(0)
        else:
            response = data.get("response")
            self.reward.append(reward(data))
            self.masked.append(bool(data.get(MASK_SAMPLE)))
            self.failure_class.append(-1)
            self.tokens.append(_tokens(response))
            self.turns.append(count_turns(response))
        self.count += 1


def _tokens(response: Any) -> int:
    """``response.usage.total_tokens`` (``polygym.row.total_tokens``, without building a dict)."""
    counts = response.get("usage") if isinstance(response, dict) else None
    total = counts.get("total_tokens") if isinstance(counts, dict) else None
    return int(total) if isinstance(total, int | float) and not isinstance(total, bool) else 0


def open_index(source: RunSource) -> RunIndex:
    index = RunIndex(source)
    index.refresh()
    return index
