"""The rollout row's one reading of rewards and tokens, and its one job builder."""

from __future__ import annotations

import math
from typing import Any

import pytest

from polygym import metrics
from polygym.row import ROLLOUT_INDEX, TASK_INDEX, make_job, reward, total_tokens, usage
from polygym.training.tokens import assemble


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, 1.0),
        (False, 0.0),
        (1, 1.0),
        (0.25, 0.25),
        (None, 0.0),
        ("1", 0.0),
        (math.nan, 0.0),
        (math.inf, 0.0),
    ],
)
def test_reward_reads_booleans_as_numbers_and_bad_values_as_zero(value: Any, expected: float) -> None:
    assert reward({"reward": value}) == expected
    assert assemble({"reward": value}, env="e").reward == expected  # the trainer reads it the same way


def test_metrics_and_pass_at_k_agree_on_boolean_rewards() -> None:
    rollouts = [{TASK_INDEX: 0, ROLLOUT_INDEX: i, "reward": ok} for i, ok in enumerate((True, False))]
    block = metrics.aggregate(rollouts)["agent_metrics"]
    assert block["mean/reward"] == 0.5 and block["pass@1"] == 0.5


def test_tokens_come_from_usage_and_ignore_non_numbers() -> None:
    rollout = {"response": {"usage": {"input_tokens": 3, "output_tokens": True, "total_tokens": 7}}}
    assert usage(rollout) == {"input_tokens": 3.0, "total_tokens": 7.0}
    assert total_tokens(rollout) == 7
    assert total_tokens({"response": None}) == 0 and total_tokens({}) == 0


def test_make_job_applies_sampling_seed_per_repeat_and_routing() -> None:
    data = {"responses_create_params": {"input": "hi", "temperature": 1.0}, "extra": 1}
    job = make_job(data, "agent_a", task=4, rollout=2, sampling={"temperature": 0.0}, seed=7)
    assert job.key == (4, 2) and job.agent == "agent_a"
    assert job.row["responses_create_params"] == {"input": "hi", "temperature": 0.0, "seed": 9}
    assert job.row["agent_ref"] == {"type": "responses_api_agents", "name": "agent_a"}
    assert job.row[TASK_INDEX] == 4 and job.row[ROLLOUT_INDEX] == 2 and job.row["extra"] == 1
    assert data["responses_create_params"] == {"input": "hi", "temperature": 1.0}  # the row is not changed
    assert "seed" not in make_job(data, "agent_a", 0, 0).row["responses_create_params"]


def test_a_verdict_replaces_the_earlier_one_a_request_carries() -> None:
    from polygym.protocol import VerifyRequest, VerifyResponse, new_response

    class Verdict(VerifyResponse):
        passed: bool

    request = VerifyRequest.model_validate(
        {
            "responses_create_params": {"input": "hi"},
            "response": new_response([], model="m"),
            "reward": 1.0,
            "passed": True,
            "task": "t1",
        }
    )
    verdict = Verdict.of(request, reward=0.0, passed=False)
    assert (verdict.reward, verdict.passed) == (0.0, False)
    assert verdict.model_dump()["task"] == "t1"  # the rest of the row is echoed back
