"""Aggregate metrics: pass@k against hand-computed values, statistics, majority voting."""

import math

import pytest

from polygym.metrics import aggregate, k_values, pass_at_k, percentile


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
    assert agent["std/reward"] == pytest.approx(0.5)  # sample std (n-1), as NeMo Gym's
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


def test_masked_samples_leave_the_statistics_and_are_counted() -> None:
    """NeMo Gym's ``mask_sample``: the reward measures a broken environment, not the policy."""
    masked = {**rollout(1, 0.0), "mask_sample": True}
    rollouts = [rollout(0, 1.0), {**rollout(0, 0.0), "mask_sample": False}, masked, {**masked}]
    metrics = aggregate(rollouts)
    agent = metrics["agent_metrics"]
    assert agent["num_rollouts"] == 4 and agent["num_tasks"] == 1
    assert agent["mean/reward"] == pytest.approx(0.5) and agent["pass@1"] == pytest.approx(0.5)
    assert not any("mask_sample" in key for key in agent)
    assert {k: v for k, v in agent.items() if k.startswith("coverage/")} == {
        "coverage/measured_rollouts": 2,
        "coverage/masked_rollouts": 2,
        "coverage/measured_tasks": 1,
        "coverage/fully_masked_tasks": 1,
    }
    assert metrics["key_metrics"]["coverage/masked_rollouts"] == 2
    assert [g["_ng_task_index"] for g in metrics["group_level_metrics"]] == [0]
    assert not any(k.startswith("coverage/") for k in aggregate(rollouts[:2])["agent_metrics"])
    everything = aggregate([masked])
    assert everything["agent_metrics"] == {
        "num_rollouts": 1,
        "coverage/measured_rollouts": 0,
        "coverage/masked_rollouts": 1,
        "coverage/measured_tasks": 0,
        "coverage/fully_masked_tasks": 1,
    }
    assert everything["group_level_metrics"] == []


def test_bookkeeping_fields_are_not_summarised() -> None:
    stamped = [{**rollout(0, 1.0), "_ng_attempt_index": 1, "_pg_step": 3}, rollout(0, 1.0)]
    agent = aggregate(stamped)["agent_metrics"]
    assert not any("/_" in key for key in agent)
    assert agent["std/reward"] == 0.0


def test_aggregate_empty() -> None:
    assert aggregate([])["agent_metrics"]["num_rollouts"] == 0


def test_nemo_gym_keys_sit_alongside_ours() -> None:
    """Token stats under NeMo Gym's names too, and one repeat row per rollout index."""
    rollouts = [
        {
            "_ng_task_index": t,
            "_ng_rollout_index": r,
            "reward": [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]][t][r],
            "response": {"usage": {"input_tokens": 10 * (t + 1), "output_tokens": 2, "total_tokens": 12}},
        }
        for t in range(3)
        for r in range(2)
        if (t, r) != (1, 1)  # one rollout of repeat 1 missing
    ]
    metrics = aggregate(rollouts)
    agent = metrics["agent_metrics"]
    assert agent["mean/input_tokens"] == agent["mean/usage/input_tokens"] == pytest.approx(20.0)
    assert agent["num_repeats"] == 2
    first, second = metrics["repeat_level_metrics"]
    assert (first["_ng_rollout_index"], first["sample_count"], first["missing_count"]) == (0, 3, 0)
    assert (second["_ng_rollout_index"], second["sample_count"], second["missing_count"]) == (1, 2, 1)
    assert first["mean/reward"] == pytest.approx(2 / 3)
    assert first["std/reward"] == pytest.approx(math.sqrt(1 / 3))  # sample std, as NeMo Gym's
    assert first["sem/reward"] == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert (first["p25/input_tokens"], first["p75/input_tokens"]) == (15.0, 25.0)
    assert second["mean/reward"] == 0.5


def test_one_repeat_has_no_repeat_rows() -> None:
    assert aggregate([rollout(0, 1.0), rollout(1, 0.0)])["repeat_level_metrics"] == []


def test_perf_summary_covers_every_rollout_and_only_the_fields_recorded() -> None:
    """NeMo Gym's ``perf_summary`` (compared with its own on the same rollouts in
    ``tests/e2e/test_nemo_gym_tools_e2e.py``): absent fields give no statistic, none at all gives None."""
    record = {
        "total_latency_ms": 10.0,
        "num_turns": 2,
        "completion_tokens": 8,
        "token_observability_coverage": 1.0,
    }
    rollouts = [{"reward": 1.0, "ng_perf": record}, {"reward": 0.0, "mask_sample": True}]
    summary = aggregate(rollouts)["perf_summary"]
    assert summary["overall_observability_coverage"] == summary["token_observability_coverage"] == 0.5
    assert summary["mean_tokens_per_turn"] == 4.0 and summary["total_latency_p99_ms"] == 10.0
    assert "mean_prompt_tokens" not in summary and summary["std_num_turns"] == 0.0
    assert aggregate([{"reward": 1.0}])["perf_summary"] is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.9) == 3.7
