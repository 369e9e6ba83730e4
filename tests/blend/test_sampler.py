"""The step sampler: exact quotas, deterministic, resumable without replay, cycling small data."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polygym.blend import sampler as sampler_module
from polygym.blend.planner import EnvDemand, make_plan
from polygym.blend.sampler import StepSampler


@st.composite
def blends(draw: st.DrawFn) -> tuple[StepSampler, dict[str, list[str]]]:
    count = draw(st.integers(min_value=1, max_value=4))
    names = [f"env{i}" for i in range(count)]
    sizes = [draw(st.integers(min_value=1, max_value=12)) for _ in names]
    weights = [draw(st.integers(min_value=1, max_value=9)) for _ in names]
    minimums = [draw(st.integers(min_value=0, max_value=2)) for _ in names]
    total = draw(st.integers(min_value=max(1, sum(minimums)), max_value=16))
    rows = {n: [f"{n}-row{i}" for i in range(size)] for n, size in zip(names, sizes, strict=True)}
    demands = [EnvDemand(n, w, m, s) for n, w, m, s in zip(names, weights, minimums, sizes, strict=True)]
    seed = draw(st.integers(min_value=0, max_value=2**31))
    return StepSampler(make_plan(demands, total), rows, seed), rows


def keyed(step: sampler_module.Step) -> list[tuple[str, str, int]]:
    return [(item.env, item.row, item.position) for item in step.items]


@given(blends(), st.integers(min_value=0, max_value=40))
@settings(max_examples=150, deadline=None, database=None)
def test_every_step_has_exactly_the_planned_quotas(blend: tuple[StepSampler, dict], number: int) -> None:
    sampler, rows = blend
    step = sampler.step(number)
    assert len(step.items) == sampler.plan.prompts_per_step
    assert Counter(item.env for item in step.items) == +Counter(sampler.plan.quotas)
    for env in sampler.plan.environments:
        share = step.shares[env.name]
        assert share.prompts == env.quota
        assert share.realized == share.planned == env.quota / sampler.plan.prompts_per_step
        assert share.target == env.target_share
    assert all(item.row in rows[item.env] for item in step.items)


@pytest.mark.slow
@given(blends(), st.integers(min_value=0, max_value=30), st.integers(min_value=1, max_value=10))
@settings(max_examples=150, deadline=None, database=None)
def test_resume_from_a_step_equals_the_uninterrupted_sequence(
    blend: tuple[StepSampler, dict], start: int, count: int
) -> None:
    sampler, rows = blend
    uninterrupted = [keyed(s) for s in sampler.steps(0, start + count)]
    fresh = StepSampler(sampler.plan, rows, sampler.seed)  # a new process: nothing cached
    resumed = [keyed(s) for s in fresh.steps(start, count)]
    assert resumed == uninterrupted[start:]
    assert [s.number for s in fresh.steps(start, count)] == list(range(start, start + count))


def test_resume_does_not_replay_earlier_steps() -> None:
    plan = make_plan([EnvDemand("a", 1.0, 0, 7), EnvDemand("b", 3.0, 0, 5)], 8)
    sampler = StepSampler(plan, {"a": list(range(7)), "b": list(range(5))}, seed=11)
    with mock.patch.object(sampler_module.random, "Random", wraps=sampler_module.random.Random) as rng:
        sampler.step(1_000_000)
    # One or two epochs per environment are shuffled, never a million steps' worth.
    assert 2 <= rng.call_count <= 4


@given(blends(), st.integers(min_value=0, max_value=2**31))
@settings(max_examples=100, deadline=None, database=None)
def test_same_seed_same_steps_other_seed_other_order(blend: tuple[StepSampler, dict], other: int) -> None:
    sampler, rows = blend
    again = StepSampler(sampler.plan, rows, sampler.seed)
    assert [keyed(s) for s in sampler.steps(0, 6)] == [keyed(s) for s in again.steps(0, 6)]


def test_a_different_seed_changes_the_order() -> None:
    plan = make_plan([EnvDemand("a", 1.0, 0, 50)], 10)
    rows = {"a": list(range(50))}
    first = [i.row for i in StepSampler(plan, rows, 1).step(0).items]
    second = [i.row for i in StepSampler(plan, rows, 2).step(0).items]
    assert first != second


@given(blends(), st.integers(min_value=1, max_value=4))
@settings(max_examples=100, deadline=None, database=None)
def test_each_epoch_uses_every_row_once_and_small_data_cycles(
    blend: tuple[StepSampler, dict], epochs: int
) -> None:
    sampler, rows = blend
    for env in sampler.plan.environments:
        if env.quota == 0:
            continue
        size = len(rows[env.name])
        positions = range(epochs * size)
        items = [sampler.item_at(env.name, p) for p in positions]
        for epoch in range(epochs):
            in_epoch = [i for i in items if i.epoch == epoch]
            assert sorted(i.index for i in in_epoch) == list(range(size))
        # the stream of steps is the stream of positions: steps 0..k cover positions 0..k*quota-1
        steps = -(-epochs * size // env.quota)
        from_steps = [i for s in sampler.steps(0, steps) for i in s.items if i.env == env.name]
        assert [i.position for i in from_steps] == list(range(steps * env.quota))
        assert [i.row for i in from_steps[: epochs * size]] == [i.row for i in items]


@given(blends(), st.integers(min_value=20, max_value=60))
@settings(max_examples=100, deadline=None, database=None)
def test_share_over_many_steps_converges_to_the_weights(blend: tuple[StepSampler, dict], steps: int) -> None:
    sampler, _ = blend
    counts: Counter[str] = Counter()
    for step in sampler.steps(0, steps):
        counts.update(item.env for item in step.items)
    total = steps * sampler.plan.prompts_per_step
    whole = sum(Fraction(e.weight) for e in sampler.plan.environments)
    for env in sampler.plan.environments:
        realized = Fraction(counts[env.name], total)
        assert realized == Fraction(env.quota, sampler.plan.prompts_per_step)  # the plan, exactly
        if not env.pinned and not any(e.pinned for e in sampler.plan.environments):
            # rounding of one step is the only gap to the weights: under one prompt per step
            assert abs(realized - Fraction(env.weight) / whole) < Fraction(1, sampler.plan.prompts_per_step)


def test_steps_to_cover_reaches_every_row() -> None:
    plan = make_plan([EnvDemand("a", 3.0, 0, 5), EnvDemand("b", 1.0, 0, 5)], 4)
    sampler = StepSampler(plan, {"a": list(range(5)), "b": list(range(5))}, seed=0)
    assert sampler.steps_to_cover() == 5
    seen = {(i.env, i.index) for s in sampler.steps(0, 5) for i in s.items}
    assert seen == {(e, i) for e in "ab" for i in range(5)}
