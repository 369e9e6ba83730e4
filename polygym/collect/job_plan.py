"""The jobs of a run as a plan: rows x repeats, expanded one job at a time as the collector takes them.

``--num-repeats 1000000`` over a 400-row dataset is 400 million jobs; built as a list (and encoded
up front as the materialized-inputs file) that is gigabytes before the first rollout. A plan
keeps only what the rows already cost — each row once, with its agent, task index, first rollout
index and repeat count — and yields ``Job`` objects lazily, so memory stays flat whatever the
repeat count. Everything a run needs to know about its jobs without expanding them is a method
here: how many there are (per agent), which agent a ``(task, rollout)`` key belongs to, and a
fingerprint that changes whenever any job would (the row, its routing, the repeats, the sampling
overrides, the seed), which is what ``--resume`` compares instead of the bytes of every job.

Indices follow NeMo Gym: identical rows share a ``_ng_task_index`` (so pass@k groups them), and
each row's repeats are consecutive (aabbcc) with rollout indices continuing across identical rows.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from polygym.row import INDEX_FIELDS, Job, make_job

MAX_NUM_REPEATS = 100_000
"""More rollouts of one row than any estimate needs; a typo (``1000000``) is refused, not queued."""


@dataclass
class Materialization:
    """Options that turn rows into jobs; the same options always give the same jobs."""

    num_repeats: int = 1
    repeats_by_agent: dict[str, int] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    interleave: bool = False
    """Send the repeats round by round (abcabc), not each row's back to back (aabbcc): NeMo Gym's
    ``--interleave-repeats``, which spreads a heavy task's rollouts over the run. Task and rollout
    indices are the same either way; only the order in which jobs are sent (and written) changes."""

    def __post_init__(self) -> None:
        for who, count in [("num_repeats", self.num_repeats), *self.repeats_by_agent.items()]:
            if not 1 <= count <= MAX_NUM_REPEATS:
                raise ValueError(f"repeats for {who}: must be from 1 to {MAX_NUM_REPEATS}, got {count}")

    def repeats(self, agent: str) -> int:
        return self.repeats_by_agent.get(agent, self.num_repeats)


@dataclass(frozen=True)
class PlannedRow:
    """One row of the plan: ``repeats`` jobs with rollout indices ``first_rollout`` onwards."""

    data: Mapping[str, Any]
    agent: str
    task: int
    first_rollout: int
    repeats: int


def _canonical(data: Mapping[str, Any]) -> bytes:
    clean = {k: v for k, v in data.items() if k not in INDEX_FIELDS}
    return orjson.dumps(clean, option=orjson.OPT_SORT_KEYS)


class JobPlan:
    """Every job of a run, in order, without holding more than one of them at a time."""

    def __init__(
        self,
        rows: list[PlannedRow],
        sampling: Mapping[str, Any] | None = None,
        seed: int | None = None,
        interleave: bool = False,
    ) -> None:
        self.rows = rows
        self.sampling = dict(sampling or {})
        self.seed = seed
        self.interleave = interleave
        self.result_types: dict[str, str] = {}
        """The environment servers its materialized task rows go to -> their implementations."""
        self._tasks: dict[int, tuple[str, int]] = {}
        for row in rows:
            agent, rollouts = self._tasks.get(row.task, (row.agent, 0))
            self._tasks[row.task] = (agent, max(rollouts, row.first_rollout + row.repeats))

    @classmethod
    def from_rows(cls, routed: Iterable[tuple[Mapping[str, Any], str]], options: Materialization) -> JobPlan:
        """The plan for ``(row data, agent)`` pairs: identical rows share a task, repeats consecutive."""
        task_ids: dict[bytes, int] = {}
        next_rollout: dict[int, int] = {}
        rows = []
        for data, agent in routed:
            task = task_ids.setdefault(_canonical(data), len(task_ids))
            first = next_rollout.get(task, 0)
            repeats = options.repeats(agent)
            next_rollout[task] = first + repeats
            rows.append(PlannedRow(data, agent, task, first, repeats))
        return cls(rows, options.sampling, options.seed, options.interleave)

    @classmethod
    def from_jobs(cls, jobs: Iterable[Job]) -> JobPlan:
        """A plan of jobs already built (``make_job`` rows, e.g. validation jobs): each one as is."""
        return cls([PlannedRow(job.row, job.agent, job.task_index, job.rollout_index, 1) for job in jobs])

    def __iter__(self) -> Iterator[Job]:
        for row, rollout in self._order():
            yield make_job(row.data, row.agent, row.task, rollout, self.sampling, self.seed)

    def _order(self) -> Iterator[tuple[PlannedRow, int]]:
        """Each row's rollouts back to back, or with ``interleave`` by rollout index, rows in plan
        order within each index (a stable sort of the back-to-back order by rollout index)."""
        if not self.interleave:
            for row in self.rows:
                for rollout in range(row.first_rollout, row.first_rollout + row.repeats):
                    yield row, rollout
            return
        last = max((row.first_rollout + row.repeats for row in self.rows), default=0)
        for rollout in range(last):
            for row in self.rows:
                if row.first_rollout <= rollout < row.first_rollout + row.repeats:
                    yield row, rollout

    def __len__(self) -> int:
        return sum(row.repeats for row in self.rows)

    def totals(self) -> Counter[str]:
        """Jobs per agent."""
        counts: Counter[str] = Counter()
        for row in self.rows:
            counts[row.agent] += row.repeats
        return counts

    def agents(self) -> set[str]:
        return {row.agent for row in self.rows}

    def agent_of(self, key: tuple[int, int]) -> str | None:
        """The agent of the job with this ``(task, rollout)`` key; None when the plan has no such job."""
        task, rollout = key
        entry = self._tasks.get(task)
        if entry is None or not 0 <= rollout < entry[1]:
            return None
        return entry[0]

    def fingerprint(self) -> str:
        """A digest of every job the plan yields, computed from the rows and options (not the jobs)."""
        digest = hashlib.sha256()
        header: list[Any] = [self.sampling, self.seed, *(["interleave"] if self.interleave else [])]
        digest.update(orjson.dumps(header, option=orjson.OPT_SORT_KEYS))
        for row in self.rows:
            entry = [row.data, row.agent, row.task, row.first_rollout, row.repeats]
            digest.update(orjson.dumps(entry, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
            digest.update(b"\n")
        return digest.hexdigest()
