"""Step-wise collection against a real inline stack driven by the scripted model."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import BlendSpec, parse_spec
from polygym.blend.stepwise import STRAGGLER, StepFiles, StepSettings, run_steps
from polygym.cli.blend_run import next_step, run_blend
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFileError
from polygym.collect.run_lock import OutputBusyError, RunLock
from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS, ENV_FIELD, ROLLOUT_INDEX, STEP_FIELD, TASK_INDEX
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from polygym.stack.session import StackTarget
from tests.conftest import ROOT

ENVS = ("example_single_tool_call", "example_multi_step")
AGENTS = {env: f"{env}_simple_agent" for env in ENVS}
LATENCY = "policy_model.responses_api_models.scripted_model.latency_ms"


def spec(tmp_path: Path, **env_overrides: Any) -> BlendSpec:
    envs = [{"name": ENVS[0], "weight": 3}, {"name": ENVS[1], "weight": 1, **env_overrides}]
    raw = {"environments": envs, "prompts_per_step": 4, "responses_per_prompt": 2, "seed": 21}
    return parse_spec(raw, "test", tmp_path)


async def started(*overrides: str) -> Stack:
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), list(overrides), env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    return stack


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    running = await started()
    try:
        yield running
    finally:
        await running.stop()


def lines(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


async def test_three_steps_realize_the_planned_shares(tmp_path: Path, stack: Stack) -> None:
    blend_spec = spec(tmp_path)
    out = tmp_path / "run" / "steps.jsonl"
    assert stack.client is not None
    reports = await run_steps(stack.client, blend_spec, out, StepSettings(3, limits=Limits(concurrency=8)))
    files = StepFiles(out)
    assert [r.step for r in reports] == [0, 1, 2]
    step_lines = lines(files.steps)
    assert len(step_lines) == 3 * 3  # two environments and the roll-up per step
    for step in range(3):
        by_env = {line["env"]: line for line in step_lines if line["step"] == step}
        assert set(by_env) == {*ENVS, ALL_ENVS}
        for env, share, prompts in ((ENVS[0], 0.75, 3), (ENVS[1], 0.25, 1)):
            line = by_env[env]
            assert line["target_share"] == line["planned_share"] == line["realized_share"] == share
            assert line["prompts"] == prompts and line["rollouts"] == line["completed"] == 2 * prompts
            assert line["failures"] == line["stragglers"] == 0
            assert line["reward_mean"] == 1.0 and line["reward_std"] == 0.0 and line["pass_rate"] == 1.0
            assert line["tokens"] > 0 and line["agent"] == AGENTS[env]
        assert by_env[ALL_ENVS]["completed"] == 8 and by_env[ALL_ENVS]["realized_share"] == 1.0
    rollouts = lines(files.output)
    assert len(rollouts) == 24
    assert sorted((r[TASK_INDEX], r[ROLLOUT_INDEX]) for r in rollouts) == [
        (t, i) for t in range(12) for i in (0, 1)
    ]
    sampler = load_blend(blend_spec).sampler()
    for rollout in rollouts:
        step, position = divmod(rollout[TASK_INDEX], 4)
        item = sampler.step(step).items[position]
        assert rollout[STEP_FIELD] == step and rollout[ENV_FIELD] == item.env
        assert rollout["agent_ref"]["name"] == AGENTS[item.env]
        assert rollout["responses_create_params"]["input"] == item.row["responses_create_params"]["input"]
        assert rollout["reward"] == 1.0
    per_step = Counter((r[STEP_FIELD], r[ENV_FIELD]) for r in rollouts)
    assert all(per_step[(s, ENVS[0])] == 6 and per_step[(s, ENVS[1])] == 2 for s in range(3))
    assert lines(files.failures) == []
    assert len(lines(files.materialized)) == 24
    metrics = orjson.loads(files.metrics.read_bytes())
    assert {m["agent_ref"]["name"]: m["agent_metrics"]["num_rollouts"] for m in metrics} == {
        AGENTS[ENVS[0]]: 18,
        AGENTS[ENVS[1]]: 6,
    }


async def test_continuing_at_a_step_matches_an_uninterrupted_run(tmp_path: Path, stack: Stack) -> None:
    assert stack.client is not None
    blend_spec = spec(tmp_path)
    whole, parts = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl"
    await run_steps(stack.client, blend_spec, whole, StepSettings(4, limits=Limits(concurrency=8)))
    await run_steps(stack.client, blend_spec, parts, StepSettings(3, limits=Limits(concurrency=8)))
    assert next_step(parts) == 3
    # pretend step 2 was cut short: continuing at 2 drops its partial records and redoes it
    await run_steps(stack.client, blend_spec, parts, StepSettings(2, 2, Limits(concurrency=8)))
    a, b = StepFiles(whole), StepFiles(parts)

    def keyed(path: Path) -> list[tuple[int, int, bytes]]:
        rows = lines(path)
        return sorted(
            (r[TASK_INDEX], r[ROLLOUT_INDEX], orjson.dumps(r["responses_create_params"])) for r in rows
        )

    assert keyed(a.output) == keyed(b.output) and len(keyed(b.output)) == 32
    assert keyed(a.materialized) == keyed(b.materialized)
    assert [(line["step"], line["env"]) for line in lines(a.steps)] == [
        (line["step"], line["env"]) for line in lines(b.steps)
    ]
    with pytest.raises(RunFileError, match="already exists"):
        await run_steps(stack.client, blend_spec, parts, StepSettings(1))
    reseeded = blend_spec.model_copy(update={"seed": 99})
    with pytest.raises(RunFileError, match="differs from what this spec gives"):
        await run_steps(stack.client, reseeded, parts, StepSettings(1, start_step=2))


async def test_step_deadline_cancels_stragglers(tmp_path: Path) -> None:
    slow = await started(f"{LATENCY}=30000")
    try:
        assert slow.client is not None
        out = tmp_path / "slow.jsonl"
        reports = await run_steps(
            slow.client,
            spec(tmp_path),
            out,
            StepSettings(2, limits=Limits(concurrency=8), step_timeout_s=0.3),
        )
    finally:
        await slow.stop()
    for report in reports:
        assert report.timed_out and report.elapsed_s < 30  # ended at the deadline, not after the model
        assert report.envs[ENVS[0]].stragglers == 6 and report.envs[ENVS[1]].stragglers == 2
        assert report.total.stragglers == 8 and report.total.completed == 0
    files = StepFiles(out)
    failures = lines(files.failures)
    assert len(failures) == 16 and {f["error_class"] for f in failures} == {STRAGGLER}
    assert Counter(f[ENV_FIELD] for f in failures) == {ENVS[0]: 12, ENVS[1]: 4}
    assert "step deadline of 0.3s" in failures[0]["error"]
    assert lines(files.output) == []
    assert [line["stragglers"] for line in lines(files.steps) if line["step"] == 1] == [6, 2, 8]


async def test_slow_environment_does_not_starve_the_other(tmp_path: Path, stack: Stack) -> None:
    """One environment's rows make the model sleep; with one slot of concurrency in total, the other
    environment still gets its own slot and completes its whole quota before the deadline."""
    assert stack.client is not None
    script = json.dumps([{"answer": "late", "sleep_ms": 60000}])
    slow_rows = []
    for line in (ROOT / "resources_servers" / ENVS[1] / "data" / "example.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        row["responses_create_params"]["metadata"] = {"script": script}
        slow_rows.append(orjson.dumps(row))
    (tmp_path / "slow.jsonl").write_bytes(b"\n".join(slow_rows) + b"\n")
    # the slow environment comes first: one shared queue would hand it the only slot
    envs = [{"name": ENVS[1], "weight": 1, "train": "slow.jsonl"}, {"name": ENVS[0], "weight": 3}]
    blend_spec = parse_spec(
        {"environments": envs, "prompts_per_step": 4, "responses_per_prompt": 2}, "t", tmp_path
    )
    out = tmp_path / "mixed.jsonl"
    reports = await run_steps(
        stack.client, blend_spec, out, StepSettings(2, limits=Limits(concurrency=1), step_timeout_s=1.0)
    )
    for report in reports:
        fast, slow = report.envs[ENVS[0]], report.envs[ENVS[1]]
        assert fast.completed == 6 and fast.stragglers == 0 and fast.reward_mean == 1.0
        assert slow.completed == 0 and slow.stragglers == 2
        assert fast.realized_share == 1.0 and slow.realized_share == 0.0  # the skew is reported
    rollouts = lines(StepFiles(out).output)
    assert Counter(r[ENV_FIELD] for r in rollouts) == {ENVS[0]: 12}


async def test_run_blend_helper_starts_a_stack_and_prints_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), env_files=[])
    out = tmp_path / "cli.jsonl"
    target = StackTarget(config, record=False)
    code = await run_blend(spec(tmp_path), target, out, StepSettings(2, limits=Limits(concurrency=4)))
    assert code == 0
    printed = capsys.readouterr().out
    assert "step 0" in printed and "step 1" in printed
    assert "2 steps (0..1) collected: 16 rollouts, 0 failed, 0 stragglers" in printed
    assert len(lines(StepFiles(out).output)) == 16
    unknown = parse_spec(
        {"environments": [{"name": "x", "train": str(out), "agent": "nobody"}], "prompts_per_step": 1},
        "test",
        tmp_path,
    )
    assert await run_blend(unknown, target, tmp_path / "u.jsonl", StepSettings(1)) == 2
    assert "unknown agent 'nobody'" in capsys.readouterr().err


async def test_a_second_run_on_a_locked_output_is_refused(tmp_path: Path, stack: Stack) -> None:
    """Two step-wise runs on one output would append the same steps twice: the second is refused."""
    out = tmp_path / "steps.jsonl"
    with RunLock(StepFiles(out)), pytest.raises(OutputBusyError, match="being written by another run"):
        await run_steps(stack.client, spec(tmp_path), out, StepSettings(1, limits=Limits(concurrency=8)))
    assert not out.exists()
