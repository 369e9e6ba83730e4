"""Dynamic sampling: groups without reward variance are replaced from the same environment, quotas exact."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.blend.dynamic_sampling import (
    DynamicSampling,
    EnvDraws,
    Refill,
    extra_item,
    has_signal,
    task_stride,
)
from polygym.blend.mix import load_blend
from polygym.blend.spec import parse_spec
from polygym.blend.stepwise import StepFiles, StepSettings, run_steps
from polygym.collect.rollouts import Limits, Result
from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS, ROLLOUT_INDEX, TASK_INDEX, Job
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from tests.blend.helpers import ENVS

SIGNAL_ROWS = 2
"""Rows of the first environment whose groups have reward variance in the fake (the rest: none)."""


def blend(tmp_path: Path) -> Any:
    envs = [{"name": ENVS[0], "weight": 3}, {"name": ENVS[1], "weight": 1}]
    raw = {"environments": envs, "prompts_per_step": 4, "responses_per_prompt": 2, "seed": 5}
    return load_blend(parse_spec(raw, "test", tmp_path))


def collected(jobs: dict[str, list[Job]], signal: Callable[[Job], bool]) -> dict[str, list[Result]]:
    """A fake collection: responses of a group with signal get rewards 0 and 1, others all 0."""
    return {
        env: [
            Result(j, 0.0, rollout={"reward": float(j.rollout_index % 2) if signal(j) else 0.0}) for j in js
        ]
        for env, js in jobs.items()
    }


def refilled(tmp_path: Path, step_number: int, bound: int) -> tuple[Refill, dict[str, list[Result]], Any]:
    """Run one step's rounds against the fake; the refill, every result, and the step."""
    mix = blend(tmp_path)
    plan, sampler = mix.plan(), mix.sampler()
    settings = StepSettings(1, dynamic_sampling=DynamicSampling(bound))
    first_rows = [orjson.dumps(r["responses_create_params"]) for r in sampler.rows[ENVS[0]][:SIGNAL_ROWS]]

    def signal(job: Job) -> bool:
        return orjson.dumps(job.row["responses_create_params"]) in first_rows

    step = sampler.step(step_number)
    refill = Refill(step, plan, sampler, DynamicSampling(bound), lambda i, t: settings.item_jobs(i, t, plan))
    results: dict[str, list[Result]] = defaultdict(list)
    round_jobs = settings.jobs(step, plan)
    while round_jobs:
        for env, env_results in collected(round_jobs, signal).items():
            results[env].extend(env_results)
        round_jobs = refill.next_round(results)
    return refill, results, step


def test_groups_without_signal_are_replaced_from_the_same_environment(tmp_path: Path) -> None:
    refill, results, step = refilled(tmp_path, step_number=3, bound=3)
    draws = refill.finish(results)
    kept = refill.kept_groups()
    env_of = {r.job.task_index: env for env, rs in results.items() for r in rs}
    # the quota is exact: 3 groups of the first environment, 1 of the second, one per slot
    assert sorted(kept.values()) == [0, 1, 2, 3]
    assert [env_of[task] for task, _ in sorted(kept.items(), key=lambda kv: kv[1])] == [
        item.env for item in step.items
    ]
    stride = task_stride(refill.plan, refill.dynamic)
    assert stride == 4 + 3 * 2 and all(3 * stride <= task < 4 * stride for task in env_of)
    # every job of an environment went to that environment's agent: extras come from the same env
    assert {env: {r.job.agent for r in rs} for env, rs in results.items()} == {
        env: {f"{env}_simple_agent"} for env in ENVS
    }
    rewards: dict[int, list[float]] = defaultdict(list)
    for r in (r for rs in results.values() for r in rs):
        rewards[r.job.task_index].append(r.rollout["reward"] if r.rollout else 0.0)
    first = draws[ENVS[0]]
    with_signal = sum(has_signal(rewards[t]) for t, _ in kept.items() if env_of[t] == ENVS[0])
    assert with_signal == SIGNAL_ROWS and first.unfilled == 3 - SIGNAL_ROWS  # 2 rows can have signal
    assert first.extra_prompts == 3  # it kept trying until the bound
    # the second environment never has signal: the bound is reached and said, its slot kept
    assert draws[ENVS[1]] == EnvDraws(
        extra_prompts=3, zero_variance_seen=4, zero_variance_dropped=3, unfilled=1
    )
    assert first.zero_variance_seen - first.zero_variance_dropped == first.unfilled


def test_extra_draws_are_deterministic_and_prefer_rows_the_step_lacks(tmp_path: Path) -> None:
    a, results_a, _ = refilled(tmp_path, step_number=2, bound=2)
    _, results_b, step = refilled(tmp_path, step_number=2, bound=2)
    rows = lambda rs: [(r.job.key, r.job.row) for env in sorted(rs) for r in rs[env]]  # noqa: E731
    assert rows(results_a) == rows(results_b)
    own = {item.index for item in step.items if item.env == ENVS[1]}
    assert extra_item(a.sampler, ENVS[1], step, 0).index not in own
    with pytest.raises(ValueError, match="max_extra_prompts >= 1"):
        DynamicSampling(0)


@pytest.mark.slow
async def test_steps_keep_their_quotas_say_the_bound_and_continue_exactly(tmp_path: Path) -> None:
    """The scripted policy is deterministic: every group has zero variance, every bound is reached."""
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), [], env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    try:
        assert stack.client is not None
        mix, dynamic = blend(tmp_path), DynamicSampling(2)
        whole, parts = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl"
        settings = lambda steps, start=0: StepSettings(  # noqa: E731
            steps, start, Limits(concurrency=8), dynamic_sampling=dynamic
        )
        reports = await run_steps(stack.client, mix, whole, settings(3))
        await run_steps(stack.client, mix, parts, settings(2))
        await run_steps(stack.client, mix, parts, settings(2, 1))  # continue at 1: step 1 redone
    finally:
        await stack.stop()
    for report in reports:
        assert {env: e.prompts for env, e in report.envs.items()} == {ENVS[0]: 3, ENVS[1]: 1}
        assert report.total.completed == 8 and sorted(report.slots.values()) == [0, 1, 2, 3]
        assert report.dynamic == {
            ENVS[0]: EnvDraws(extra_prompts=2, zero_variance_seen=5, zero_variance_dropped=2, unfilled=3),
            ENVS[1]: EnvDraws(extra_prompts=2, zero_variance_seen=3, zero_variance_dropped=2, unfilled=1),
        }
    step_lines = list(iter_jsonl(StepFiles(whole).steps))
    assert step_lines[2]["env"] == ALL_ENVS and step_lines[2]["dynamic_sampling"]["extra_prompts"] == 4
    # extras are collected and written, in their step's block of task indices
    rollouts = list(iter_jsonl(StepFiles(whole).output))
    assert len(rollouts) == 3 * (4 + 4) * 2
    assert all(r[TASK_INDEX] // (4 + 2 * 2) == r["_pg_step"] for r in rollouts)

    def keyed(path: Path) -> list[tuple[int, int, bytes]]:
        return sorted(
            (r[TASK_INDEX], r[ROLLOUT_INDEX], orjson.dumps(r["responses_create_params"]))
            for r in iter_jsonl(path)
        )

    a, b = StepFiles(whole), StepFiles(parts)
    assert keyed(a.output) == keyed(b.output) and keyed(a.materialized) == keyed(b.materialized)
    assert [(x["step"], x["env"]) for x in iter_jsonl(a.steps)] == [
        (x["step"], x["env"]) for x in iter_jsonl(b.steps)
    ]


@pytest.mark.parametrize(("late", "extras"), [(False, 3 + 3), (True, 0)])
async def test_no_extra_round_starts_after_the_step_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: bool, extras: int
) -> None:
    """A round that ends past the deadline ends the step: nothing more is drawn, nothing unsent counted."""
    from types import SimpleNamespace

    from polygym.blend import stepwise

    clock = [0.0]
    monkeypatch.setattr(stepwise, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    async def fake_collect(client: Any, jobs: Any, limits: Any, deadline: Any, on_result: Any) -> bool:
        for env, results in collected(jobs, lambda job: False).items():
            for result in results:
                on_result(env, result)
        clock[0] += 10.0 if late else 0.1  # the round took longer than the step's 5 s
        return False

    monkeypatch.setattr(stepwise, "_collect_step", fake_collect)
    mix = blend(tmp_path)
    plan, sampler = mix.plan(), mix.sampler()
    settings = StepSettings(1, step_timeout_s=5.0, dynamic_sampling=DynamicSampling(3))
    step = sampler.step(0)
    refill = Refill(step, plan, sampler, DynamicSampling(3), lambda i, t: settings.item_jobs(i, t, plan))
    recorder = stepwise._StepRecorder(0, SimpleNamespace(rollout=lambda r: None), None)  # type: ignore[arg-type]
    client: Any = None  # the fake collection never calls it
    _, sent = await stepwise._collect_rounds(
        client, settings.jobs(step, plan), settings, refill, recorder, list
    )
    assert sum(refill.draws.values()) == extras
    assert sum(len(jobs) for jobs in sent.values()) == (4 + extras) * 2
    assert refill.finish(recorder.results)[ENVS[1]].unfilled == 1
