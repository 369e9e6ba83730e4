"""run_files.prepare: one preparation of output files for fresh, resumed and continued runs."""

from pathlib import Path

import pytest

from polygym.collect.run_files import RunFileError, RunFiles, done_keys, prepare
from polygym.jsonl import iter_jsonl

JOBS = b'{"_ng_task_index":0,"_ng_rollout_index":0}\n{"_ng_task_index":1,"_ng_rollout_index":0}\n'


def fresh(tmp_path: Path) -> RunFiles:
    files = RunFiles(tmp_path / "out" / "run.jsonl")
    prepare(files, resume=False, overwrite=False, materialized=JOBS)
    return files


def test_a_fresh_start_writes_the_jobs_and_refuses_to_replace_a_run(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    assert files.materialized.read_bytes() == JOBS
    assert files.output.read_bytes() == files.failures.read_bytes() == b""
    files.metrics.write_text("[]")
    with pytest.raises(RunFileError, match="already exists; pass --resume to finish that run or --overwrite"):
        prepare(files, resume=False, overwrite=False, materialized=JOBS)
    prepare(files, resume=False, overwrite=True, materialized=b"")
    assert files.materialized.read_bytes() == b"" and not files.metrics.exists()


def test_resume_keeps_finished_rollouts_and_reruns_failures(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    files.output.write_bytes(b'{"_ng_task_index":0,"_ng_rollout_index":0}\n{"_ng_task_index":1,')  # torn
    files.failures.write_bytes(b'{"_ng_task_index":1,"_ng_rollout_index":0}\n')
    prepare(files, resume=True, overwrite=False, materialized=JOBS)
    assert done_keys(files.output) == {(0, 0)} and files.output.read_bytes().endswith(b"}\n")
    assert list(iter_jsonl(files.failures)) == []
    with pytest.raises(RunFileError, match="the input or the run options changed"):
        prepare(files, resume=True, overwrite=False, materialized=JOBS[: JOBS.index(b"\n") + 1])


def test_a_run_that_appends_its_jobs_chooses_what_a_continued_run_keeps(tmp_path: Path) -> None:
    files = fresh(tmp_path)
    kept: list[RunFiles] = []
    prepare(files, resume=True, overwrite=False, keep=kept.append)
    assert kept == [files] and files.materialized.read_bytes() == JOBS  # no byte check without jobs
    with pytest.raises(RunFileError, match="already exists; pass a start step"):
        prepare(files, resume=False, overwrite=False, how_to_continue="pass a start step")
