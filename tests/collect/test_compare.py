"""`gym eval compare`: per-environment deltas, regressions beyond the threshold, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from polygym import metrics
from polygym.cli.compare import compare_command
from polygym.collect.compare import CompareError, compare
from polygym.row import ALL_ENVS

A = "example_single_tool_call_simple_agent"
B = "example_multi_step_simple_agent"


def entry(agent: str, rewards: list[list[float]], failures: int = 0) -> dict[str, Any]:
    """An ``_aggregate_metrics.json`` entry as gym eval run writes it, from rewards per task."""
    rollouts = [
        {"_ng_task_index": task, "_ng_rollout_index": i, "reward": reward}
        for task, group in enumerate(rewards)
        for i, reward in enumerate(group)
    ]
    block = metrics.aggregate(rollouts)
    block["agent_metrics"]["num_failures"] = failures
    return {"agent_ref": {"type": "responses_api_agents", "name": agent}, **block}


def write(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(entries))
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(compare_command, list(args), catch_exceptions=False)


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    base = write(
        tmp_path / "base_aggregate_metrics.json",
        [entry(A, [[1, 1], [1, 0], [0, 0]]), entry(B, [[1, 0], [1, 0], [0, 0]])],
    )
    # A improves; B drops from 2/6 to 1/6 correct (mean reward -0.1667)
    new = write(
        tmp_path / "new_aggregate_metrics.json",
        [entry(A, [[1, 1], [1, 1], [1, 0]], failures=3), entry(B, [[1, 0], [0, 0], [0, 0]])],
    )
    return base, new


def test_deltas_and_regressions_per_environment(runs: tuple[Path, Path]) -> None:
    result = compare(*runs)
    by_env = {e.env: e for e in result.environments}
    assert by_env[A].status == "ok" and by_env[B].status == "regression"
    reward_b = next(m for m in by_env[B].metrics if m.metric == "mean/reward")
    assert reward_b.base == pytest.approx(2 / 6) and reward_b.new == pytest.approx(1 / 6)
    assert reward_b.delta == pytest.approx(-1 / 6) and reward_b.regression
    reward_a = next(m for m in by_env[A].metrics if m.metric == "mean/reward")
    assert reward_a.delta == pytest.approx(2 / 6) and not reward_a.regression
    assert {m.metric for m in by_env[A].metrics} == {"mean/reward", "pass@1", "pass@2", "pass@1[avg-of-k]"}
    # the roll-up averages environments: A +0.333, B -0.167 -> +0.083, not a regression
    rollup = by_env[ALL_ENVS]
    assert next(m for m in rollup.metrics if m.metric == "mean/reward").delta == pytest.approx(1 / 12)
    assert result.regressions[0].startswith(f"{B}: ")
    assert not any(r.startswith("(all)") and "mean/reward" in r for r in result.regressions)


def test_threshold_is_absolute(runs: tuple[Path, Path]) -> None:
    assert compare(*runs, threshold=0.4).regressions == []
    assert [r.split(" ")[1] for r in compare(*runs, threshold=0.2).regressions] == ["pass@2"]
    assert {r.split(" ")[1] for r in compare(*runs, threshold=0.1).regressions} >= {"pass@2", "mean/reward"}


def test_table_json_and_exit_codes(runs: tuple[Path, Path]) -> None:
    base, new = (str(p) for p in runs)
    table = run(base, new)
    assert table.exit_code == 0
    assert "regression" in table.stdout and B in table.stdout and "-0.1667" in table.stdout
    failing = run(base, new, "--fail-on-regression")
    assert failing.exit_code == 1
    assert run(base, new, "--fail-on-regression", "--threshold", "0.5").exit_code == 0
    data = orjson.loads(run(base, new, "--json").stdout)
    assert data["threshold"] == 0.02
    assert [e["env"] for e in data["environments"]] == [B, A, ALL_ENVS]  # the key in files
    assert "(all)" in table.stdout  # the label in tables
    assert data["environments"][0]["status"] == "regression"
    assert any(line.startswith(f"{B}: mean/reward 0.3333 -> 0.1667") for line in data["regressions"])
    same = run(base, base, "--fail-on-regression")
    assert same.exit_code == 0 and "no regressions" in same.stdout


def test_chosen_metrics_counts_are_shown_not_judged(runs: tuple[Path, Path]) -> None:
    result = compare(*runs, metrics=["num_failures", "mean/reward"])
    a = next(e for e in result.environments if e.env == A)
    failures = next(m for m in a.metrics if m.metric == "num_failures")
    assert failures.delta == 3 and not failures.regression
    assert [m.metric for m in a.metrics] == ["mean/reward", "num_failures"]


def test_missing_environment_is_a_regression_and_folders_work(tmp_path: Path) -> None:
    write(tmp_path / "base" / "math_aggregate_metrics.json", [entry(A, [[1, 1]])])
    write(tmp_path / "base" / "code_aggregate_metrics.json", [entry(B, [[1, 0]])])
    write(tmp_path / "new" / "math_aggregate_metrics.json", [entry(A, [[1, 1]]), entry("new_agent", [[1]])])
    result = compare(tmp_path / "base", tmp_path / "new")
    status = {e.env: e.status for e in result.environments}
    assert status == {A: "ok", B: "missing", "new_agent": "added"}
    assert result.regressions == [f"{B}: missing in the new run"]
    assert run(str(tmp_path / "base"), str(tmp_path / "new"), "--fail-on-regression").exit_code == 1


def test_unusable_inputs_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    not_metrics = tmp_path / "x_aggregate_metrics.json"
    not_metrics.write_text('{"agent_metrics": {}}')
    good = write(tmp_path / "g_aggregate_metrics.json", [entry(A, [[1]])])
    for path, message in (
        (tmp_path / "nope.json", "no such file or folder"),
        (tmp_path / "empty", "no *_aggregate_metrics.json files"),
        (not_metrics, "expected a list of per-agent entries"),
    ):
        result = run(str(path), str(good))
        assert result.exit_code == 2 and message in result.stderr
    with pytest.raises(CompareError, match="threshold"):
        compare(good, good, threshold=-1)
