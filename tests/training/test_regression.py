"""The ``--max-regression`` rule at each of its boundaries (``polygym.collect.regression``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polygym.collect.regression import judge_regression, task_rewards

BEFORE = {task: 1.0 for task in range(32)}


def lost(count: int) -> dict[int, float]:
    """The 32 prompts of BEFORE with the first ``count`` now failed."""
    return {task: 0.0 if task < count else 1.0 for task in range(32)}


def test_a_drop_just_above_delta_with_an_interval_excluding_0_alarms() -> None:
    verdict = judge_regression("a", 4, BEFORE, lost(8), 0.24)  # drop 0.25
    assert verdict.alarm and verdict.drop == 0.25 and verdict.n == 32
    assert verdict.interval is not None and 0 < verdict.interval[0] <= 0.25 <= verdict.interval[1]
    low, high = verdict.interval
    assert verdict.describe() == (
        f"a validation reward fell +0.250 since step 0 (1.000 -> 0.750 over 32 prompts; 95% interval of "
        f"the drop [{low:+.3f}, {high:+.3f}], excludes 0): more than --max-regression 0.24"
    )


@pytest.mark.parametrize("limit", [0.25, 0.26])
def test_a_drop_at_or_just_below_delta_does_not_alarm(limit: float) -> None:
    verdict = judge_regression("a", 4, BEFORE, lost(8), limit)
    assert not verdict.alarm and verdict.drop == 0.25
    assert verdict.describe().endswith(f"not more than --max-regression {limit:g}")


def test_a_drop_past_delta_whose_interval_touches_0_does_not_alarm() -> None:
    """One flipped answer of 32: drop 0.031 > 0.03, but most resamples leave the prompt out."""
    verdict = judge_regression("a", 4, BEFORE, lost(1), 0.03)
    assert verdict.drop == pytest.approx(1 / 32) and verdict.interval is not None
    assert verdict.interval[0] == 0.0 and not verdict.alarm
    assert "includes 0" in verdict.describe()
    assert not judge_regression("a", 4, BEFORE, lost(3), 0.03).alarm  # 4% of resamples miss all three
    assert judge_regression("a", 4, BEFORE, lost(4), 0.03).alarm  # four of 32: the interval clears 0


def test_each_delta_fires_at_the_first_drop_past_it_that_the_interval_separates_from_noise() -> None:
    """With 32 prompts at 1.0, DELTA 0 / 0.05 / 0.10 / 0.15 fire at drops 0.125 / 0.125 / 0.125 /
    0.156 (4, 4, 4, 5 prompts lost); the rule this replaced fired at 0.125 / 0.156 / 0.25 / 0.281."""
    first = {
        limit: next(
            count for count in range(33) if judge_regression("a", 1, BEFORE, lost(count), limit).alarm
        )
        for limit in (0.0, 0.05, 0.10, 0.15)
    }
    assert first == {0.0: 4, 0.05: 4, 0.10: 4, 0.15: 5}


def test_an_empty_validation_is_an_alarm_not_a_crash() -> None:
    verdict = judge_regression("a", 6, BEFORE, {}, 0.1)
    assert verdict.alarm and verdict.drop is None and verdict.n == 0
    assert verdict.describe() == "a: no validation rollout was scored at step 6 (--max-regression alarm)"


def test_a_single_shared_prompt_is_judged_on_its_point_drop() -> None:
    verdict = judge_regression("a", 2, {0: 1.0}, {0: 0.0}, 0.5)
    assert verdict.alarm and verdict.interval is None
    assert "no interval (fewer than 2 shared prompts)" in verdict.describe()


def test_task_rewards_reads_a_validation_file_per_environment(tmp_path: Path) -> None:
    rows = [
        {"agent_ref": {"name": "a_agent"}, "_ng_task_index": 3, "reward": 1.0},
        {"agent_ref": {"name": "a_agent"}, "_ng_task_index": 3, "reward": 0.0},
        {"agent_ref": {"name": "other"}, "_ng_task_index": 4, "reward": 1.0},
    ]
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    agents = {"a_agent": "a", "b_agent": "b"}
    assert task_rewards(path, agents) == {"a": {3: 0.5}, "b": {}}
    assert task_rewards(tmp_path / "missing.jsonl", agents) == {"a": {}, "b": {}}
