"""The step planner: exact quotas, minimums honoured, clear errors, useful suggestions."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from polygym.blend.planner import (
    EnvDemand,
    InfeasiblePlanError,
    apportion,
    demands_from_weights,
    largest_remainder,
    make_plan,
    prompts_needed,
    suggest_prompts_per_step,
)
from tests.conftest import ROOT

weights_st = st.one_of(
    st.integers(min_value=1, max_value=50).map(float),
    st.floats(min_value=0.01, max_value=100.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def demands(draw: st.DrawFn, with_minimums: bool = True) -> list[EnvDemand]:
    count = draw(st.integers(min_value=1, max_value=7))
    out = []
    for i in range(count):
        minimum = draw(st.integers(min_value=0, max_value=6)) if with_minimums else 0
        out.append(EnvDemand(f"env{i}", draw(weights_st), minimum, draw(st.integers(1, 500))))
    return out


@pytest.mark.slow
@given(demands(), st.integers(min_value=1, max_value=300))
@settings(max_examples=300, deadline=None, database=None)
def test_quotas_are_exact_and_honour_minimums(envs: list[EnvDemand], total: int) -> None:
    needed = sum(e.min_per_step for e in envs)
    if needed > total:
        with pytest.raises(InfeasiblePlanError) as info:
            apportion(envs, total)
        assert info.value.min_prompts_per_step == needed
        assert f"at least {needed}" in str(info.value)
        return
    quotas = apportion(envs, total)
    assert sum(quotas) == total
    assert all(q >= e.min_per_step for q, e in zip(quotas, envs, strict=True))
    assert quotas == apportion(envs, total)  # deterministic


@pytest.mark.slow
@given(demands(with_minimums=False), st.integers(min_value=1, max_value=300))
@settings(max_examples=300, deadline=None, database=None)
def test_without_minimums_every_quota_is_within_one_of_its_weight_share(
    envs: list[EnvDemand], total: int
) -> None:
    quotas = apportion(envs, total)
    whole = sum(Fraction(e.weight) for e in envs)
    for quota, env in zip(quotas, envs, strict=True):
        ideal = Fraction(env.weight) * total / whole
        assert abs(quota - ideal) < 1


@given(demands(), st.integers(min_value=1, max_value=300))
@example(  # found by hypothesis: env4 is pinned only after env3's minimum takes its share
    [
        EnvDemand("env0", 1.0, 0, 1),
        EnvDemand("env1", 1.0, 0, 1),
        EnvDemand("env2", 1.0, 0, 1),
        EnvDemand("env3", 1.0, 6, 1),
        EnvDemand("env4", 3.0, 3, 1),
        EnvDemand("env5", 4.0, 0, 1),
    ],
    11,
)
@pytest.mark.slow
@settings(max_examples=200, deadline=None, database=None)
def test_pinned_environments_get_exactly_their_minimum_and_the_rest_follow_weights(
    envs: list[EnvDemand], total: int
) -> None:
    assume(sum(e.min_per_step for e in envs) <= total)
    plan = make_plan(envs, total)
    free = [p for p in plan.environments if not p.pinned]
    for env in plan.environments:
        if env.pinned:
            assert env.quota == env.min_per_step
    # Among the environments not pinned, a heavier one never gets fewer prompts than a lighter one
    # by more than the one prompt rounding can move.
    for a in free:
        for b in free:
            if a.weight > b.weight:
                assert a.quota >= b.quota - 1


@pytest.mark.slow
@given(
    demands(),
    st.integers(min_value=0, max_value=4),
    st.integers(min_value=1, max_value=16),
    st.integers(min_value=0, max_value=16),
)
@settings(max_examples=200, deadline=None, database=None)
def test_suggested_step_size_needs_no_forcing_and_no_warning(
    envs: list[EnvDemand], warn_below: int, responses: int, warn_below_rollouts: int
) -> None:
    suggested = suggest_prompts_per_step(envs, warn_below, responses, warn_below_rollouts)
    plan = make_plan(envs, suggested, responses, warn_below, warn_below_rollouts)
    assert plan.suggested_prompts_per_step == suggested
    assert not any(p.pinned for p in plan.environments)
    assert plan.warnings == []
    assert all(p.quota >= max(p.min_per_step, warn_below) for p in plan.environments)
    assert all(p.rollouts_per_step >= warn_below_rollouts for p in plan.environments)


@pytest.mark.parametrize("responses", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("count", [2, 5, 10])
def test_prompts_per_step_scale_with_the_environments_added(count: int, responses: int) -> None:
    """The rule docs/multi_env_batches.md states: n equal environments need n x max(2 prompts,
    ceil(8 rollouts / responses)) prompts per step, and one prompt fewer warns."""
    envs = demands_from_weights({f"env{i}": 1.0 for i in range(count)})
    each = prompts_needed(responses, 2, 8)
    assert each == max(2, -(-8 // responses))
    assert suggest_prompts_per_step(envs, responses_per_prompt=responses) == count * each
    assert make_plan(envs, count * each, responses).warnings == []
    assert make_plan(envs, count * each - 1, responses).warnings != []


def test_three_to_one_in_a_step_of_four() -> None:
    plan = make_plan(
        demands_from_weights({"a": 3, "b": 1}, rows={"a": 30, "b": 5}), 4, responses_per_prompt=2
    )
    assert plan.quotas == {"a": 3, "b": 1}
    assert plan.global_batch_size == 8
    assert [e.rollouts_per_step for e in plan.environments] == [6, 2]
    assert [e.steps_per_epoch for e in plan.environments] == [10.0, 5.0]
    hint = "prompts_per_step 15 (15 x 2 = 30 rollouts) fits every environment by weight"
    assert plan.warnings == [
        f"a: only 3 prompts x 2 responses = 6 rollouts per step (fewer than 8 rollouts); its gradient "
        f"signal per step is noisy; {hint}",
        f"b: only 1 prompt x 2 responses = 2 rollouts per step (fewer than 2 prompts and fewer than 8 "
        f"rollouts); its gradient signal per step is noisy; {hint}",
    ]
    assert plan.starved == []


def test_minimum_lifts_a_small_environment_and_is_reported() -> None:
    plan = make_plan(demands_from_weights({"big": 10, "small": 1}, {"small": 3}), 8)
    assert plan.quotas == {"big": 5, "small": 3}
    small = plan.environments[1]
    assert small.pinned and small.planned_share == 3 / 8
    assert any("small: raised to its min_per_step 3" in w for w in plan.warnings)
    assert plan.min_prompts_per_step == 3


def test_ties_go_to_the_earlier_environment_and_starvation_is_warned() -> None:
    plan = make_plan(demands_from_weights({"a": 1, "b": 1, "c": 1}), 2)
    assert plan.quotas == {"a": 1, "b": 1, "c": 0}
    assert any(w.startswith("c: starved, 0 prompts in every step") for w in plan.warnings)
    assert plan.starved == ["c"] and plan.to_dict()["starved"] == ["c"]


def test_infeasible_minimums_name_the_smallest_step() -> None:
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(demands_from_weights({"a": 1, "b": 1}, {"a": 3, "b": 4}), 5)
    message = str(info.value)
    assert "minimums add up to 7" in message and "prompts_per_step is 5" in message
    assert "raise prompts_per_step to at least 7" in message
    assert info.value.min_prompts_per_step == 7


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="weight must be"):
        apportion([EnvDemand("a", 0.0)], 4)
    with pytest.raises(ValueError, match="at least 1"):
        apportion([EnvDemand("a", 1.0)], 0)
    with pytest.raises(ValueError, match="unique"):
        apportion([EnvDemand("a", 1.0), EnvDemand("a", 2.0)], 4)
    assert largest_remainder([], 3) == []


def test_the_docs_table_is_the_planners() -> None:
    """docs/multi_env_batches.md's table of prompts per step for 2, 5, 10 environments."""
    page = (ROOT / "docs" / "multi_env_batches.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\d+ prompts .+) \|$", page, flags=re.MULTILINE)
    assert [int(count) for count, _ in rows] == [2, 5, 10]
    for count, cells in rows:
        envs = demands_from_weights({f"env{i}": 1.0 for i in range(int(count))})
        for responses, cell in zip((2, 4, 8), cells.split(" | "), strict=True):
            prompts = suggest_prompts_per_step(envs, responses_per_prompt=responses)
            assert cell == f"{prompts} prompts ({prompts * responses} rollouts)"
