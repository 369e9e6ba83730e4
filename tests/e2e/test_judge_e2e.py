"""A judge that gives no verdict fails the row as judge_failed; --resume with a working judge redoes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl
from polygym.servers.judge import JUDGE_FAILED
from tests.conftest import JUDGE_CONFIG, JUDGE_DATA, JUDGE_SERVE, run_gym

pytestmark = pytest.mark.e2e


def run(tmp_path: Path, judge_answer: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "judge.yaml").write_text(JUDGE_CONFIG.format(answer=judge_answer))
    args = ("--input", str(JUDGE_DATA), "--output", "out.jsonl", *extra)
    return run_gym("eval", "run", *JUDGE_SERVE, *args, cwd=tmp_path)


def test_judge_failures_are_failures_and_resume_redoes_them(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out.jsonl")
    first = run(tmp_path, "I cannot decide.")
    assert first.returncode == 1, first.stderr  # every rollout failed: the run says so
    assert "5 of 5 rollouts failed (judge_failed: 5)" in first.stderr.strip().splitlines()[-1]
    failures = list(iter_jsonl(files.failures))
    assert [f["error_class"] for f in failures] == [JUDGE_FAILED] * 5
    assert "no readable verdict in 2 attempt(s)" in failures[0]["error"]
    assert list(iter_jsonl(files.output)) == []
    metrics = orjson.loads(files.metrics.read_bytes())[0]["agent_metrics"]
    assert (metrics["num_rollouts"], metrics["num_failures"]) == (0, 5)
    assert "mean/reward" not in metrics  # a judge failure is never averaged in as a 0

    second = run(tmp_path, "VERDICT: INCORRECT", "--resume", "--allow-stack-change")
    assert second.returncode == 0, second.stderr
    rows = list(iter_jsonl(files.output))
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3, 4]
    assert {(r["reward"], r["judge_verdict"]) for r in rows} == {(0.0, False)}
    assert {r["_ng_attempt_index"] for r in rows} == {1}  # one failed attempt before, as NeMo Gym counts
    assert all("_ng_attempt_index" not in r for r in iter_jsonl(files.materialized))
    assert list(iter_jsonl(files.failures)) == []
