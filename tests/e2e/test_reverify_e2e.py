"""`gym eval reverify` end to end: new files next to untouched old ones, diff counts, --failed-only,
judge failures, exact --resume, and joining a running stack."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.collect.reverify import diff_path, reverified_path
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.servers.judge import JUDGE_FAILED
from tests.conftest import JUDGE_CONFIG, JUDGE_DATA, JUDGE_SERVE, ROOT, interrupt_gym, row_keys, run_gym

pytestmark = pytest.mark.e2e

ENV = "example_single_tool_call"
AGENT = f"{ENV}_simple_agent"
SERVE = ["--model-type", "scripted_model", "--resources-server", ENV]
DATA = ROOT / f"resources_servers/{ENV}/data/example.jsonl"


def digests(files: RunFiles) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in [*files.all(), files.record]}


def diff_of(output: Path) -> dict[str, Any]:
    return orjson.loads(diff_path(output).read_bytes())


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `gym eval run` of the example environment (5 rollouts, every reward 1.0), copied per test."""
    where = tmp_path_factory.mktemp("collected")
    result = run_gym("eval", "run", *SERVE, "--input", str(DATA), "--output", "out.jsonl", cwd=where)
    assert result.returncode == 0, result.stderr
    assert [r["reward"] for r in iter_jsonl(where / "out.jsonl")] == [1.0] * 5
    return where


@pytest.fixture
def run_dir(collected: Path, tmp_path: Path) -> Path:
    for path in collected.glob("out*"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def tamper(path: Path, change: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite rows of ``path`` by position; returns the rows as written."""
    rows = [{**row, **change.get(i, {})} for i, row in enumerate(iter_jsonl(path))]
    write_jsonl(rows, path)
    return rows


def test_reverify_recomputes_rewards_into_new_files_and_resumes_exactly(run_dir: Path) -> None:
    old = RunFiles(run_dir / "out.jsonl")
    tamper(old.output, {0: {"reward": 0.0}, 1: {"reward": 0.5}, 2: {"reward": 2.0}})
    before = digests(old)

    result = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", cwd=run_dir)
    assert result.returncode == 0, result.stderr
    assert "3 rewards changed; 5 rows reverified" in result.stdout
    new = RunFiles(reverified_path(old.output))
    assert new.output.name == "out_reverified.jsonl"
    assert [r["reward"] for r in iter_jsonl(new.output)] == [1.0] * 5
    assert list(iter_jsonl(new.failures)) == []
    metrics = orjson.loads(new.metrics.read_bytes())[0]
    assert (metrics["agent_ref"]["name"], metrics["agent_metrics"]["mean/reward"]) == (AGENT, 1.0)
    diff = diff_of(new.output)
    assert diff_path(new.output).name == "out_reverify_diff.json"
    assert diff["changed"] == 3
    counts = diff["per_environment"][AGENT]
    assert (counts["unchanged"], counts["raised"], counts["lowered"], counts["newly_failed"]) == (2, 2, 1, 0)
    assert digests(old) == before  # the old files are byte-identical

    again = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", cwd=run_dir)
    assert again.returncode == 2 and "already exists" in again.stderr

    # an interrupted reverify: two rows written, the third torn mid-line
    lines = new.output.read_bytes().splitlines(keepends=True)
    new.output.write_bytes(b"".join(lines[:2]) + lines[2][:40])
    resumed = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", "--resume", cwd=run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "3 rows reverified, 2 already done" in resumed.stdout
    assert sorted(row_keys(new.output)) == sorted(row_keys(old.output)) and len(row_keys(new.output)) == 5
    assert count_lines(new.materialized) == 5
    assert diff_of(new.output)["per_environment"][AGENT] == counts
    assert digests(old) == before

    tamper(old.output, {3: {"reward": 0.1}})  # not the rollouts that reverify began with
    changed = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", "--resume", cwd=run_dir)
    assert changed.returncode == 2 and "cannot resume" in changed.stderr


def count_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def test_failed_only_reverifies_only_failed_rows_and_carries_the_rest(run_dir: Path) -> None:
    old = RunFiles(run_dir / "out.jsonl")
    rows = list(iter_jsonl(old.output))
    failed_row = rows.pop(2)  # its verification failed: in the failures file with its response
    write_jsonl(rows, old.output)
    rows = tamper(old.output, {0: {"reward": 0.0, "error_class": JUDGE_FAILED}, 1: {"reward": 0.25}})
    no_response = {"agent_ref": failed_row["agent_ref"], "_ng_task_index": 9, "_ng_rollout_index": 0}
    write_jsonl(
        [
            {"agent_ref": failed_row["agent_ref"], "error_class": JUDGE_FAILED, "row": failed_row},
            {**no_response, "error_class": "Timeout", "row": {"responses_create_params": {"input": []}}},
        ],
        old.failures,
    )
    before = digests(old)

    result = run_gym(
        "eval", "reverify", *SERVE, "--rollouts", "out.jsonl", "--judge-failed-only", cwd=run_dir
    )
    assert result.returncode == 0, result.stderr
    assert "1 failed rows have no response to verify" in result.stdout
    new = RunFiles(reverified_path(old.output))
    by_key = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in iter_jsonl(new.output)}
    assert len(by_key) == 5
    for carried in rows[1:]:  # untouched: the tampered 0.25 stays, since the row had not failed
        assert by_key[(carried["_ng_task_index"], carried["_ng_rollout_index"])] == carried
    assert by_key[(rows[0]["_ng_task_index"], 0)]["reward"] == 1.0
    assert by_key[(failed_row["_ng_task_index"], 0)]["reward"] == 1.0
    counts = diff_of(new.output)["per_environment"][AGENT]
    assert (counts["fixed"], counts["carried"], counts["unchanged"]) == (2, 3, 0)
    assert diff_of(new.output)["not_reverifiable_no_response"] == 1
    assert digests(old) == before


def judged(tmp_path: Path, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "judge.yaml").write_text(JUDGE_CONFIG.format(answer=answer))
    return run_gym("eval", *args[:1], *JUDGE_SERVE, *args[1:], cwd=tmp_path)


def test_judge_failures_of_a_reverify_are_recorded_and_failed_only_fixes_them(tmp_path: Path) -> None:
    first = judged(tmp_path, "VERDICT: CORRECT", "run", "--input", str(JUDGE_DATA), "--output", "out.jsonl")
    assert first.returncode == 0, first.stderr
    down = judged(tmp_path, "I cannot decide.", "reverify", "--rollouts", "out.jsonl")
    assert down.returncode == 1, down.stderr  # failures are recorded, never an abort, and said
    assert "5 of 5 rows failed (judge_failed: 5)" in down.stderr.strip().splitlines()[-1]
    new = RunFiles(tmp_path / "out_reverified.jsonl")
    failures = list(iter_jsonl(new.failures))
    assert [f["error_class"] for f in failures] == [JUDGE_FAILED] * 5
    assert all("response" in f["row"] for f in failures)
    assert diff_of(new.output)["per_environment"]["_all"]["newly_failed"] == 5

    up = judged(
        tmp_path, "VERDICT: INCORRECT", "reverify", "--rollouts", "out_reverified.jsonl", "--failed-only"
    )
    assert up.returncode == 0, up.stderr
    fixed = tmp_path / "out_reverified_reverified.jsonl"
    assert sorted(r["_ng_task_index"] for r in iter_jsonl(fixed)) == [0, 1, 2, 3, 4]
    assert {(r["reward"], r["judge_verdict"]) for r in iter_jsonl(fixed)} == {(0.0, False)}
    assert diff_of(fixed)["per_environment"]["_all"]["fixed"] == 5


def test_reverify_joins_a_running_stack(run_dir: Path, start_stack: Any) -> None:
    stack = start_stack(*SERVE)
    tamper(run_dir / "out.jsonl", {4: {"reward": 0.0}})
    result = run_gym(
        "eval",
        "reverify",
        "--no-serve",
        "--head-url",
        stack.record["head_url"],
        "--rollouts",
        "out.jsonl",
        cwd=run_dir,
    )
    assert result.returncode == 0, result.stderr
    assert diff_of(run_dir / "out_reverified.jsonl")["changed"] == 1


@pytest.fixture(scope="module")
def judged_twelve_times(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One judged `gym eval run` of 5 rows x 12 repeats (every verdict correct), for the signals'
    cases to copy: each reverifies the same 60 rollouts."""
    where = tmp_path_factory.mktemp("judged")
    args = ["run", "--input", str(JUDGE_DATA), "--output", "out.jsonl", "--num-repeats", "12"]
    first = judged(where, "VERDICT: CORRECT", *args)
    assert first.returncode == 0, first.stderr
    return where


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_reverify_resumes_exactly(
    judged_twelve_times: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    for path in judged_twelve_times.glob("out*"):
        shutil.copy(path, tmp_path / path.name)
    slow_judge = JUDGE_CONFIG.format(answer="VERDICT: INCORRECT").replace(
        "app.py", "app.py\n      latency_ms: 40"
    )
    (tmp_path / "judge.yaml").write_text(slow_judge)
    args = ["eval", "reverify", *JUDGE_SERVE, "--rollouts", "out.jsonl", "--concurrency", "2"]
    out = tmp_path / "out_reverified.jsonl"
    returncode, stderr = interrupt_gym(args, tmp_path, out, 8, sig)
    if sig == signal.SIGINT:
        assert returncode == 130 and "resume with:" in stderr
    partial = row_keys(out)
    assert 8 <= len(partial) < 60
    resumed = run_gym(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    final = row_keys(out)
    assert len(final) == len(set(final)) == 60
    assert f"{60 - len(partial)} rows reverified, {len(partial)} already done" in resumed.stdout
    assert {r["reward"] for r in iter_jsonl(out)} == {0.0}
    assert diff_of(out)["per_environment"]["_all"]["lowered"] == 60


def test_rows_of_an_agent_the_stack_lacks_are_refused_naming_it(run_dir: Path) -> None:
    other = ["--model-type", "scripted_model", "--resources-server", "example_multi_step"]
    result = run_gym("eval", "reverify", *other, "--rollouts", "out.jsonl", cwd=run_dir)
    assert result.returncode == 2
    assert AGENT in result.stderr and "out.jsonl" in result.stderr
    assert not (run_dir / "out_reverified.jsonl").exists()


def test_rows_routed_by_task_source_are_reverified_by_their_agent(run_dir: Path) -> None:
    """NeMo Gym's newer rows name their environment in ``task_source`` and carry no ``agent_ref``:
    reverify routes them as ``gym eval run`` does, to the one agent that references it."""
    files = RunFiles(run_dir / "out.jsonl")
    for path in (files.output, files.materialized):
        rows = [{k: v for k, v in row.items() if k != "agent_ref"} for row in iter_jsonl(path)]
        write_jsonl([{**row, "task_source": ENV} for row in rows], path)
    tamper(files.output, {0: {"reward": 0.0}})
    result = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", cwd=run_dir)
    assert result.returncode == 0, result.stderr
    new = RunFiles(reverified_path(files.output))
    assert [r["reward"] for r in iter_jsonl(new.output)] == [1.0] * 5
    assert diff_of(new.output)["per_environment"][AGENT]["raised"] == 1

    write_jsonl([{**row, "task_source": "no_such_env"} for row in iter_jsonl(files.output)], files.output)
    refused = run_gym("eval", "reverify", *SERVE, "--rollouts", "out.jsonl", "--overwrite", cwd=run_dir)
    assert refused.returncode == 2
    assert "task_source 'no_such_env': cannot route: not a server instance" in refused.stderr
