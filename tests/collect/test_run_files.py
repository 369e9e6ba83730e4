"""run_files.prepare: one preparation of output files for fresh, resumed and continued runs."""

from pathlib import Path

import pytest

from polygym.collect.run_files import RunFileError, RunFiles, done_keys, finished_keys, prepare, read_record
from polygym.jsonl import iter_jsonl

JOBS = b'{"_ng_task_index":0,"_ng_rollout_index":0}\n{"_ng_task_index":1,"_ng_rollout_index":0}\n'
PLAN = "fingerprint-of-the-plan"


def fresh(tmp_path: Path) -> RunFiles:
    files = RunFiles(tmp_path / "out" / "run.jsonl")
    prepare(files, resume=False, overwrite=False, fingerprint=PLAN)
    return files


def test_a_fresh_start_records_the_plan_and_refuses_to_replace_a_run(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    assert read_record(files) == {"plan_fingerprint": PLAN}
    assert files.materialized.read_bytes() == files.output.read_bytes() == files.failures.read_bytes() == b""
    files.materialized.write_bytes(JOBS)  # appended as jobs are dispatched
    files.metrics.write_text("[]")
    with pytest.raises(RunFileError, match="already exists; pass --resume to finish that run or --overwrite"):
        prepare(files, resume=False, overwrite=False, fingerprint=PLAN)
    prepare(files, resume=False, overwrite=True, fingerprint="another")
    assert files.materialized.read_bytes() == b"" and not files.metrics.exists()
    assert read_record(files) == {"plan_fingerprint": "another"}


def test_resume_keeps_finished_rollouts_and_reruns_failures(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    files.materialized.write_bytes(JOBS + b'{"_ng_task_ind')  # torn by kill -9 while dispatching
    files.output.write_bytes(b'{"_ng_task_index":0,"_ng_rollout_index":0}\n{"_ng_task_index":1,')  # torn
    files.failures.write_bytes(b'{"_ng_task_index":1,"_ng_rollout_index":0}\n')
    prepare(files, resume=True, overwrite=False, fingerprint=PLAN)
    assert done_keys(files.output) == {(0, 0)} and files.output.read_bytes().endswith(b"}\n")
    assert files.materialized.read_bytes() == JOBS
    assert list(iter_jsonl(files.failures)) == []
    with pytest.raises(RunFileError, match="the input or the run options changed"):
        prepare(files, resume=True, overwrite=False, fingerprint="a changed plan")


def test_resume_keeps_the_failures_their_server_marked_terminal(tmp_path: Path) -> None:
    """NeMo Gym's typed outcome: ``_ng_failure_terminal: true`` means never attempt it again."""
    files = fresh(tmp_path)
    files.output.write_bytes(b'{"_ng_task_index":0,"_ng_rollout_index":0}\n')
    terminal = b'{"_ng_task_index":1,"_ng_rollout_index":0,"_ng_failure_terminal":true}\n'
    again = b'{"_ng_task_index":2,"_ng_rollout_index":0,"_ng_failure_terminal":false}\n'
    files.failures.write_bytes(terminal + again + b'{"_ng_task_index":3,')  # torn
    prepare(files, resume=True, overwrite=False, fingerprint=PLAN)
    assert files.failures.read_bytes() == terminal
    assert finished_keys(files) == {(0, 0), (1, 0)}


def test_resume_without_a_run_record_is_refused(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    files.record.unlink()
    with pytest.raises(RunFileError, match=r"cannot resume: .*run.json does not exist"):
        prepare(files, resume=True, overwrite=False, fingerprint=PLAN)


def test_a_run_that_appends_its_jobs_chooses_what_a_continued_run_keeps(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    files.materialized.write_bytes(JOBS)
    kept: list[RunFiles] = []
    prepare(files, resume=True, overwrite=False, keep=kept.append)
    assert kept == [files] and files.materialized.read_bytes() == JOBS  # no plan check without one
    with pytest.raises(RunFileError, match="already exists; pass a start step"):
        prepare(files, resume=False, overwrite=False, how_to_continue="pass a start step")
