"""`gym eval compare`: per-environment deltas with intervals, flips, several candidates, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from polygym import metrics
from polygym.cli.compare import compare_command
from polygym.collect.compare import DEFAULT_THRESHOLD, CompareError, compare
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
    by_env = {e.env: e for e in result.candidates[0].environments}
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
    envs = data["candidates"][0]["environments"]
    assert [e["env"] for e in envs] == [B, A, ALL_ENVS]  # the key in files
    assert "(all)" in table.stdout  # the label in tables
    assert envs[0]["status"] == "regression" and envs[0]["note"].startswith("no rollouts file")
    assert {m["method"] for e in envs for m in e["metrics"]} == {"point"}
    assert any(line.startswith(f"{B}: mean/reward 0.3333 -> 0.1667") for line in data["regressions"])
    same = run(base, base, "--fail-on-regression")
    assert same.exit_code == 0 and "no regressions" in same.stdout


def test_chosen_metrics_counts_are_shown_not_judged(runs: tuple[Path, Path]) -> None:
    result = compare(*runs, metrics=["num_failures", "mean/reward"])
    a = next(e for e in result.candidates[0].environments if e.env == A)
    failures = next(m for m in a.metrics if m.metric == "num_failures")
    assert failures.delta == 3 and not failures.regression
    assert [m.metric for m in a.metrics] == ["mean/reward", "num_failures"]


def test_missing_environment_is_a_regression_and_folders_work(tmp_path: Path) -> None:
    write(tmp_path / "base" / "math_aggregate_metrics.json", [entry(A, [[1, 1]])])
    write(tmp_path / "base" / "code_aggregate_metrics.json", [entry(B, [[1, 0]])])
    write(tmp_path / "new" / "math_aggregate_metrics.json", [entry(A, [[1, 1]]), entry("new_agent", [[1]])])
    result = compare(tmp_path / "base", tmp_path / "new")
    status = {e.env: e.status for e in result.candidates[0].environments}
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


# With the rollouts file beside the metrics file: per-task values, intervals, flips.


def write_run(
    stem: Path, envs: dict[str, list[list[float]]], first_task: int = 0, metrics_file: bool = True
) -> Path:
    """``stem.jsonl`` (one row per rollout, as gym eval run writes them) and, unless told not to,
    ``stem_aggregate_metrics.json``; returns the rollouts file."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [
        {
            "_ng_task_index": first_task + task,
            "_ng_rollout_index": i,
            "agent_ref": {"type": "responses_api_agents", "name": agent},
            "reward": reward,
        }
        for agent, tasks in envs.items()
        for task, group in enumerate(tasks)
        for i, reward in enumerate(group)
    ]
    rollouts = stem.with_name(stem.name + ".jsonl")
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    if metrics_file:
        by_agent = {a: [r for r in rows if r["agent_ref"]["name"] == a] for a in envs}
        entries = [{"agent_ref": {"name": a}, **metrics.aggregate(r)} for a, r in by_agent.items()]
        write(stem.with_name(stem.name + "_aggregate_metrics.json"), entries)
    return rollouts


def solved_tasks(flags: list[int], repeats: int = 2) -> list[list[float]]:
    return [[float(f)] * repeats for f in flags]


BASE_A = [1] * 20 + [0] * 20  # 40 tasks, half solved
DROP_A = [0] * 16 + [1] * 4 + [0] * 20  # 16 of the solved lost: a clear regression
NOISE_A = [0, 0, 0] + [1] * 17 + [1, 1] + [0] * 18  # 3 lost, 2 gained: -0.025, within noise


def reward_of(env: Any) -> Any:
    return next(m for m in env.metrics if m.metric == "mean/reward")


def test_identical_runs_interval_contains_zero_and_no_flips(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A)})
    result = compare(base, write_run(tmp_path / "same", {A: solved_tasks(BASE_A)}))
    env = result.candidates[0].environments[0]
    m = reward_of(env)
    assert m.method == "paired-bootstrap" and m.delta == 0.0 and m.low == 0.0 and m.high == 0.0
    assert env.paired_tasks == 40 and env.lost == [] and env.gained == [] and env.note == ""
    assert result.regressions == []


def test_clear_regression_has_interval_below_threshold_and_fails(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A)})
    new = write_run(tmp_path / "new", {A: solved_tasks(DROP_A)})
    env = compare(base, new).candidates[0].environments[0]
    m = reward_of(env)
    assert m.delta == pytest.approx(-0.4) and m.high is not None and m.high < -0.2 and m.regression
    assert env.lost == list(range(16)) and env.gained == []
    result = run(str(base), str(new), "--fail-on-regression")
    assert result.exit_code == 1 and "CI [" in result.stdout and "16 solved -> unsolved" in result.stdout


def test_point_drop_within_noise_does_not_fail(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A)})
    new = write_run(tmp_path / "new", {A: solved_tasks(NOISE_A)})
    m = reward_of(compare(base, new).candidates[0].environments[0])
    assert m.delta == pytest.approx(-0.025) and m.delta < -DEFAULT_THRESHOLD  # the point says "regression"
    assert m.low is not None and m.high is not None and m.low < 0 < m.high and not m.regression
    assert run(str(base), str(new), "--fail-on-regression").exit_code == 0
    # the same two runs without their rollouts: no interval, the point delta decides
    base.unlink()
    new.unlink()
    points = compare(tmp_path / "base_aggregate_metrics.json", tmp_path / "new_aggregate_metrics.json")
    assert reward_of(points.candidates[0].environments[0]).regression


def test_several_candidates_markdown_and_json(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A), B: solved_tasks(BASE_A)})
    good = write_run(tmp_path / "good", {A: solved_tasks(BASE_A), B: solved_tasks(BASE_A)})
    bad = write_run(tmp_path / "bad", {A: solved_tasks(BASE_A), B: solved_tasks(DROP_A)})
    md = run(str(base), str(good), str(bad), "--format", "md", "--bootstrap", "300")
    assert md.exit_code == 0
    assert md.stdout.startswith(f"# Compare against `{base}`") and "300 bootstrap resamples" in md.stdout
    assert f"## `{good}`" in md.stdout and f"## `{bad}`" in md.stdout
    assert f"| {B} | mean/reward | 0.5000 | 0.1000 | -0.4000 | [" in md.stdout
    assert f"- {bad}: {B}: mean/reward 0.5000 -> 0.1000 (-0.4000, CI [" in md.stdout
    data = orjson.loads(run(str(base), str(good), str(bad), "--json", "--bootstrap", "300").stdout)
    assert [c["new"] for c in data["candidates"]] == [str(good), str(bad)]
    assert data["bootstrap"] == 300 and data["confidence"] == 0.95 and data["seed"] == 0
    assert data["candidates"][0]["regressions"] == []
    bad_envs = {e["env"]: e for e in data["candidates"][1]["environments"]}
    assert bad_envs[B]["lost"] == list(range(16)) and bad_envs[B]["status"] == "regression"
    rollup = next(m for m in bad_envs[ALL_ENVS]["metrics"] if m["metric"] == "mean/reward")
    assert rollup["delta"] == pytest.approx(-0.2) and rollup["method"] == "paired-bootstrap"
    assert all(line.startswith(f"{bad}: ") for line in data["regressions"])


def test_nemo_gym_flags_reports_and_determinism(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A)})
    new = write_run(tmp_path / "new", {A: solved_tasks(NOISE_A)})
    out = tmp_path / "report"
    both = f"{new},{new}"
    first = run("--baseline", str(base), "--candidates", both, "-o", str(out), "--json", "--seed", "3")
    assert first.exit_code == 0 and len(orjson.loads(first.stdout)["candidates"]) == 2
    assert orjson.loads((out / "compare_report.json").read_bytes()) == orjson.loads(first.stdout)
    assert (out / "compare_report.md").read_text().startswith("# Compare against")
    again = run("--baseline", str(base), "--candidates", str(new), "--json", "--seed", "3").stdout
    other = run("--baseline", str(base), "--candidates", str(new), "--json", "--seed", "4").stdout
    assert reward_of_json(again) == reward_of_json(first.stdout) != reward_of_json(other)
    assert run(str(base)).exit_code == 2
    assert run(str(base), str(new), "--confidence", "1").exit_code == 2


def reward_of_json(text: str) -> tuple[float, float]:
    data = orjson.loads(text)
    m = next(m for m in data["candidates"][0]["environments"][0]["metrics"] if m["metric"] == "mean/reward")
    return m["low"], m["high"]


def test_unpaired_runs_use_welch_and_a_rollouts_file_alone_works(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A)}, metrics_file=False)
    new = write_run(tmp_path / "new", {A: solved_tasks(DROP_A)}, first_task=1000, metrics_file=False)
    env = compare(base, new).candidates[0].environments[0]
    m = reward_of(env)
    assert m.method == "welch" and m.delta == pytest.approx(-0.4) and m.high is not None and m.high < 0
    assert env.paired_tasks == 0 and env.lost == [] and env.gained == []
    assert {x.metric for x in env.metrics} >= {"mean/reward", "pass@1", "pass@2", "pass@1[avg-of-k]"}


def test_one_candidate_json_keeps_the_two_run_shape(runs: tuple[Path, Path]) -> None:
    data = compare(*runs).to_dict()
    assert data["new"] == str(runs[1]) and data["environments"] == data["candidates"][0]["environments"]
    assert "environments" not in compare(runs[0], [runs[1], runs[1]]).to_dict()


def test_agent_limits_the_environments(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", {A: solved_tasks(BASE_A), B: solved_tasks(BASE_A)})
    new = write_run(tmp_path / "new", {A: solved_tasks(BASE_A), B: solved_tasks(DROP_A)})
    only_a = run(str(base), str(new), "--agent", A, "--json", "--fail-on-regression")
    assert only_a.exit_code == 0
    assert [e["env"] for e in orjson.loads(only_a.stdout)["environments"]] == [A]
    unknown = run(str(base), str(new), "--agent", "nope")
    assert unknown.exit_code == 2 and "no environment nope" in unknown.stderr


def test_folders_find_each_metrics_files_rollouts(tmp_path: Path) -> None:
    for side, flags in (("base", BASE_A), ("new", DROP_A)):
        write_run(tmp_path / side / "math", {A: solved_tasks(BASE_A)})
        write_run(tmp_path / side / "code", {B: solved_tasks(flags)})
    envs = {e.env: e for e in compare(tmp_path / "base", tmp_path / "new").candidates[0].environments}
    assert reward_of(envs[A]).method == reward_of(envs[B]).method == "paired-bootstrap"
    assert envs[B].status == "regression" and envs[A].status == "ok" and len(envs[B].lost) == 16


def _rollouts(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_task_identity_is_the_index_else_the_prompt_and_masked_rows_have_no_reward(tmp_path: Path) -> None:
    agent = {"type": "responses_api_agents", "name": A}
    same_prompt = {"responses_create_params": {"input": "guess the number"}, "agent_ref": agent}
    # four games with one prompt: four tasks by their index, one task without it
    indexed = [{**same_prompt, "_ng_task_index": t, "reward": float(t % 2)} for t in range(4)]
    masked = {**same_prompt, "_ng_task_index": 9, "reward": 1.0, "mask_sample": True}
    base = _rollouts(tmp_path / "indexed.jsonl", [*indexed, masked])
    [env] = compare(base, base).candidates[0].environments
    assert env.paired_tasks == 4  # the masked row's task has no scored rollout
    assert next(m for m in env.metrics if m.metric == "mean/reward").base == 0.5
    bare = [{k: v for k, v in row.items() if k != "_ng_task_index"} for row in indexed]
    unindexed = _rollouts(tmp_path / "bare.jsonl", bare)
    [env] = compare(unindexed, unindexed).candidates[0].environments
    assert env.paired_tasks == 1  # the documented fallback: one prompt, one task
