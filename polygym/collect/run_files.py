"""The files of one collection run, and the rules that make it resumable without loss.

For ``--output X.jsonl`` (DESIGN §3):
``X_materialized_inputs.jsonl`` every job as sent, appended in plan order as each is dispatched;
``X.jsonl`` rollouts appended and flushed as they finish (completion order);
``X_failures.jsonl`` rollouts that failed for good in the latest attempt;
``X_aggregate_metrics.json`` per-agent metrics, written at the end;
``X_run.json`` what identifies the run: its job plan's fingerprint and the stack it ran against;
``X_run.lock`` held by the run writing the files (``polygym.collect.run_lock``).

Resuming re-plans the jobs from the same input and options and refuses to continue unless the
plan's fingerprint is the one recorded: a changed input would silently mix two datasets. Done
rollouts are the (task, rollout) keys present in ``X.jsonl``; a torn last line left by a
``kill -9`` is cut off before appending. A failure is run again, unless its server marked it
terminal (``_ng_failure_terminal: true`` in its typed outcome, NeMo Gym's "never attempt this
episode again"): that one stays in ``X_failures.jsonl`` and counts as finished, as in NeMo Gym.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from polygym.jsonl import JsonlAppender, encode_jsonl, iter_jsonl, truncate_torn_tail
from polygym.row import NG_FAILURE_TERMINAL, ROLLOUT_INDEX, TASK_INDEX

PLAN_KEY = "plan_fingerprint"
"""The run record's key for ``JobPlan.fingerprint()``."""


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

    @property
    def record(self) -> Path:
        return self._sibling("_run.json")

    @property
    def lock(self) -> Path:
        return self._sibling("_run.lock")

    def all(self) -> list[Path]:
        return [self.output, self.materialized, self.failures, self.metrics]

    def jsonl_files(self) -> list[Path]:
        """Every file of the run but the metrics: the JSON Lines it writes as it goes."""
        return [path for path in self.all() if path != self.metrics]


def done_keys(path: Path) -> set[tuple[int, int]]:
    return _keys(iter_jsonl(path))


def _keys(rows: Iterable[dict[str, Any]]) -> set[tuple[int, int]]:
    """The (task, rollout) keys of ``rows``; a row without them has none."""
    return {(r[TASK_INDEX], r[ROLLOUT_INDEX]) for r in rows if TASK_INDEX in r and ROLLOUT_INDEX in r}


def terminal(failure: dict[str, Any]) -> bool:
    """Whether a failure row must never be run again (its server said so, NeMo Gym's marker)."""
    return failure.get(NG_FAILURE_TERMINAL) is True


def finished_keys(files: RunFiles) -> set[tuple[int, int]]:
    """The keys a resumed run does not run again: its rollouts and its terminal failures."""
    return done_keys(files.output) | _keys(f for f in iter_jsonl(files.failures) if terminal(f))


def prepare(
    files: RunFiles,
    resume: bool,
    overwrite: bool,
    fingerprint: str | None = None,
    keep: Callable[[RunFiles], None] | None = None,
    how_to_continue: str = "pass --resume to finish that run",
) -> None:
    """Make ``files`` ready for a fresh run, or for continuing the interrupted run they hold.

    One function for every kind of run, so that all of them refuse to replace a run unless told
    to (``overwrite``; the message says ``how_to_continue`` instead) and start from the same clean
    set of files. ``fingerprint`` is the job plan's (``gym eval run``): recorded on a fresh start
    and, on resume, required equal to the recorded one, which proves the input and options
    unchanged; None for a run that checks its own continuation (step-wise collection). ``keep``
    cuts the files of a continued run back to what it keeps (default ``keep_finished``;
    step-wise collection keeps the steps before its start step).
    """
    files.output.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        _start_fresh(files, overwrite, how_to_continue)
        if fingerprint is not None:
            write_record(files, {PLAN_KEY: fingerprint})
        return
    if fingerprint is not None:
        _check_plan(files, fingerprint)
    (keep or keep_finished)(files)


def _start_fresh(files: RunFiles, overwrite: bool, how_to_continue: str) -> None:
    existing = [p for p in (files.output, files.materialized) if p.exists() and p.stat().st_size]
    if existing and not overwrite:
        raise RunFileError(f"{existing[0]} already exists; {how_to_continue} or --overwrite to start over")
    for path in files.jsonl_files():
        path.write_bytes(b"")
    files.metrics.unlink(missing_ok=True)
    files.record.unlink(missing_ok=True)


def _check_plan(files: RunFiles, fingerprint: str) -> None:
    record = read_record(files)
    if record is None or PLAN_KEY not in record:
        raise RunFileError(
            f"cannot resume: {files.record} does not exist or is not a run record "
            "(start the run without --resume, or over with --overwrite)"
        )
    if record[PLAN_KEY] != fingerprint:
        raise RunFileError(
            f"cannot resume: the input or the run options changed since {files.record} was written; "
            "resume with the same --input, --limit, --num-repeats, sampling flags and --seed, or start over "
            "with --overwrite"
        )


def read_record(files: RunFiles) -> dict[str, Any] | None:
    """The run record (``X_run.json``), or None when there is none or it is not a JSON object."""
    try:
        data = orjson.loads(files.record.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_record(files: RunFiles, record: dict[str, Any]) -> None:
    """Replace the run record atomically, so a crash mid-write never leaves half a record."""
    partial = files.record.with_name(files.record.name + ".partial")
    partial.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    partial.replace(files.record)


def keep_finished(files: RunFiles) -> None:
    """What a resumed ``gym eval run`` keeps: its finished rollouts, its terminal failures and the
    jobs dispatched so far, each less a torn last line. The other failures are cleared, since
    their jobs run again."""
    for path in (files.output, files.materialized, files.failures):
        if path.exists():
            truncate_torn_tail(path)
        else:
            path.write_bytes(b"")
    kept = [f for f in iter_jsonl(files.failures) if terminal(f)]
    files.failures.write_bytes(encode_jsonl(kept))


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
