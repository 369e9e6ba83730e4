"""The files of one collection run, and the rules that make it resumable without loss.

For ``--output X.jsonl`` (DESIGN §3):
``X_materialized_inputs.jsonl`` every job as sent, written before the first rollout;
``X.jsonl`` rollouts appended and flushed as they finish (completion order);
``X_failures.jsonl`` rollouts that failed for good in the latest attempt;
``X_aggregate_metrics.json`` per-agent metrics, written at the end.

Resuming re-materializes the jobs from the same input and options and refuses to continue unless
they are byte-identical to the materialized file: a changed input would silently mix two
datasets. Done rollouts are the (task, rollout) keys present in ``X.jsonl``; a torn last line
left by a ``kill -9`` is cut off before appending.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polygym.collect.dataset import ROLLOUT_INDEX, TASK_INDEX, Job
from polygym.jsonl import JsonlAppender, encode_jsonl, iter_jsonl, truncate_torn_tail


class RunFileError(Exception):
    """The output files are in a state we must not touch; the message says what to do."""


@dataclass(frozen=True)
class RunFiles:
    output: Path

    def _sibling(self, suffix: str) -> Path:
        stem = self.output.name[: -len(".jsonl")] if self.output.name.endswith(".jsonl") else self.output.name
        return self.output.with_name(stem + suffix)

    @property
    def materialized(self) -> Path:
        return self._sibling("_materialized_inputs.jsonl")

    @property
    def failures(self) -> Path:
        return self._sibling("_failures.jsonl")

    @property
    def metrics(self) -> Path:
        return self._sibling("_aggregate_metrics.json")

    def all(self) -> list[Path]:
        return [self.output, self.materialized, self.failures, self.metrics]


def done_keys(path: Path) -> set[tuple[int, int]]:
    return {
        (r[TASK_INDEX], r[ROLLOUT_INDEX]) for r in iter_jsonl(path) if TASK_INDEX in r and ROLLOUT_INDEX in r
    }


def prepare(files: RunFiles, jobs: list[Job], resume: bool, overwrite: bool) -> set[tuple[int, int]]:
    """Set up the files for a fresh or resumed run; returns the keys already done."""
    files.output.parent.mkdir(parents=True, exist_ok=True)
    materialized = encode_jsonl(job.row for job in jobs)
    if resume:
        return _prepare_resume(files, materialized, jobs)
    existing = [p for p in (files.output, files.materialized) if p.exists() and p.stat().st_size]
    if existing and not overwrite:
        raise RunFileError(
            f"{existing[0]} already exists; pass --resume to finish that run or --overwrite to start over"
        )
    files.materialized.write_bytes(materialized)
    for path in (files.output, files.failures):
        path.write_bytes(b"")
    files.metrics.unlink(missing_ok=True)
    return set()


def _prepare_resume(files: RunFiles, materialized: bytes, jobs: list[Job]) -> set[tuple[int, int]]:
    if not files.materialized.exists():
        raise RunFileError(
            f"cannot resume: {files.materialized} does not exist (start the run without --resume)"
        )
    if files.materialized.read_bytes() != materialized:
        raise RunFileError(
            f"cannot resume: the input or the run options changed since {files.materialized} was written; "
            "resume with the same --input, --limit, --num-repeats, sampling flags and --seed, or start over "
            "with --overwrite"
        )
    if files.output.exists():
        truncate_torn_tail(files.output)
    else:
        files.output.write_bytes(b"")
    files.failures.write_bytes(b"")
    wanted = {job.key for job in jobs}
    return done_keys(files.output) & wanted


class RolloutWriter:
    """Appends rollouts and failures, flushing each line so a crash loses nothing finished."""

    def __init__(self, files: RunFiles) -> None:
        self._out = JsonlAppender(files.output)
        self._failures = JsonlAppender(files.failures)

    def rollout(self, rollout: dict[str, Any]) -> None:
        self._out.write(rollout)

    def failure(self, failure: dict[str, Any]) -> None:
        self._failures.write(failure)

    def close(self) -> None:
        self._out.close()
        self._failures.close()

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
