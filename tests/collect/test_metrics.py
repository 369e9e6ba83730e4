"""Aggregate metrics: pass@k against hand-computed values, statistics, majority voting."""

import math

import pytest

from polygym.metrics import aggregate, k_values, pass_at_k


def test_pass_at_k_hand_computed() -> None:
    # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1: pass@4 = 1; pass@3 = 1 - C(3,3)/C(4,3) = 0.75
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_k_values() -> None:
    assert k_values(1) == [1]
    assert k_values(4) == [1, 2, 4]
    assert k_values(5) == [1, 2, 4, 5]


def rollout(task: int, reward: float, answer: str | None = None) -> dict:
    row = {
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
        "reward": reward,
        "response": {"usage": {"total_tokens": 10}},
    }
    if answer is not None:
        row["answer"] = answer
    return row


def test_aggregate_groups_by_task() -> None:
    rollouts = [rollout(0, 1.0), rollout(0, 0.0), rollout(1, 0.0), rollout(1, 0.0)]
    metrics = aggregate(rollouts)
    agent = metrics["agent_metrics"]
    assert agent["num_rollouts"] == 4 and agent["num_tasks"] == 2
    assert agent["mean/reward"] == pytest.approx(0.25)
    assert agent["std/reward"] == pytest.approx(math.sqrt(0.1875))
    # task 0: pass@2 = 1, task 1: 0 -> mean 0.5; pass@1 = (0.5 + 0) / 2
    assert agent["pass@2"] == pytest.approx(0.5)
    assert agent["pass@1"] == pytest.approx(0.25)
    assert agent["pass@1[avg-of-k]"] == pytest.approx(0.25)
    assert agent["mean/usage/total_tokens"] == 10
    assert metrics["key_metrics"]["mean/reward"] == pytest.approx(0.25)
    assert [g["_ng_task_index"] for g in metrics["group_level_metrics"]] == [0, 1]


def test_majority_at_k() -> None:
    rollouts = [
        rollout(0, 1.0, "4"),
        rollout(0, 1.0, "4"),
        rollout(0, 0.0, "5"),
        rollout(1, 0.0, "7"),
        rollout(1, 0.0, "7"),
        rollout(1, 1.0, "6"),
    ]
    agent = aggregate(rollouts, answer_field="answer")["agent_metrics"]
    assert agent["majority@3"] == pytest.approx(0.5)


def test_aggregate_empty() -> None:
    assert aggregate([])["agent_metrics"]["num_rollouts"] == 0
