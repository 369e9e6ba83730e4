"""Token-level rollouts, contiguity, step stats and GRPO advantages, on a real stack with the scripted model.

The scripted model's fake tokenization (UTF-8 bytes of each item rendered as text, log-prob 0)
makes every expected token sequence computable by hand from the rollout's own items.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import BlendSpec, parse_spec
from polygym.blend.stepwise import StepFiles
from polygym.jsonl import iter_jsonl
from polygym.row import ALL_ENVS, ENV_FIELD, ROLLOUT_INDEX, TASK_INDEX
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.token_fields import LOGPROB_SEMANTICS_FIELD
from polygym.training.advantages import group_advantages, zero_variance_groups
from polygym.training.collector import (
    MixedLogprobSemanticsError,
    TokenCollector,
    TokenStep,
    env_token_stats,
    token_step,
)
from polygym.training.tokens import assemble, model_calls
from polygym.training.trl_adapter import PolygymGRPO
from responses_api_models.scripted_model.app import fake_token_ids

ENVS = ("example_single_tool_call", "example_multi_step")


def spec(tmp_path: Path) -> BlendSpec:
    raw = {
        "environments": [{"name": ENVS[0], "weight": 1}, {"name": ENVS[1], "weight": 1}],
        "prompts_per_step": 4,
        "responses_per_prompt": 2,
        "seed": 3,
    }
    return parse_spec(raw, "test", tmp_path)


def stack_config(*overrides: str) -> Any:
    return load_config(selector_paths(list(ENVS), ["scripted_model"], []), list(overrides), env_files=[])


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[TokenStep], Path]:
    tmp = tmp_path_factory.mktemp("tokens")
    out = tmp / "run" / "train.jsonl"
    with TokenCollector(spec(tmp), out, stack_config=stack_config()) as collector:
        steps = [collector.step(), collector.step()]
    return steps, out


def rendered(items: list[dict[str, Any]], instructions: Any = None) -> bytes:
    return bytes(fake_token_ids(items, instructions))


def test_multi_turn_tool_episodes_assemble_exactly(collected: tuple[list[TokenStep], Path]) -> None:
    steps, out = collected
    raw = {(r[TASK_INDEX], r[ROLLOUT_INDEX]): r for r in iter_jsonl(StepFiles(out).output)}
    multi_turn = 0
    for step in steps:
        assert [(r.group_id, r.rollout_index) for r in step.rollouts] == sorted(
            (r.group_id, r.rollout_index) for r in step.rollouts
        )
        for rollout in step.rollouts:
            row = raw[(rollout.group_id, rollout.rollout_index)]
            params, output = row["responses_create_params"], row["response"]["output"]
            model_items = [i for i in output if i["type"] in ("message", "function_call")]
            tool_outputs = [i for i in output if i["type"] == "function_call_output"]
            assert rollout.num_turns == len(model_items) == len(tool_outputs) + 1
            multi_turn += rollout.num_turns > 2
            # the whole episode: the prompt, then every model turn and tool output in order
            prompt = rendered(params["input"], params.get("instructions"))
            assert bytes(rollout.input_ids) == prompt + rendered(output)
            assert rollout.prompt_length == len(prompt)
            # the loss mask covers exactly the model's items, nothing of the prompt or the tools
            generated = bytes(t for t, m in zip(rollout.input_ids, rollout.loss_mask, strict=True) if m)
            assert generated == rendered(model_items)
            assert rollout.loss_mask[: rollout.prompt_length] == [0] * rollout.prompt_length
            assert len(rollout.logprobs) == len(rollout.input_ids)
            assert all(lp == 0.0 for lp in rollout.logprobs)
            assert rollout.contiguous and not rollout.masked and rollout.problem is None
            assert rollout.reward == 1.0 and not rollout.truncated
            assert rollout.env in ENVS and rollout.step == step.step
            assert rollout.completion_ids == rollout.input_ids[rollout.prompt_length :]
    assert multi_turn > 0, "the blend must contain episodes with several tool calls"


def test_step_stats_per_environment(collected: tuple[list[TokenStep], Path]) -> None:
    steps, _ = collected
    for number, step in enumerate(steps):
        assert step.step == number
        assert list(step.stats) == [*ENVS, ALL_ENVS]
        for env in ENVS:
            stats = step.stats[env]
            mine = [r for r in step.rollouts if r.env == env]
            assert stats.completed == len(mine) == stats.rollouts == 4
            assert stats.prompts == 2 and stats.groups == 2
            assert stats.realized_share == stats.target_share == 0.5
            assert stats.reward_mean == 1.0 and stats.reward_std == 0.0 and stats.pass_rate == 1.0
            assert stats.zero_variance_groups == 2 and stats.zero_variance_share == 1.0
            assert stats.tokens == sum(len(r.input_ids) for r in mine)
            assert 0 < stats.generated_tokens == sum(sum(r.loss_mask) for r in mine) < stats.tokens
            assert stats.masked == stats.non_contiguous == stats.truncated == stats.failures == 0
            assert stats.turns_mean == sum(r.num_turns for r in mine) / 4
        assert step.total.completed == 8 and step.total.groups == 4
        metrics = step.metrics()
        assert metrics[f"polygym/{ENVS[0]}/reward_mean"] == 1.0
        assert metrics["polygym/all/completed"] == 8.0
        assert {line["env"] for line in step.log_lines()} == {*ENVS, ALL_ENVS}


def _multi_turn_row(out: Path) -> dict[str, Any]:
    for row in iter_jsonl(StepFiles(out).output):
        if len(model_calls(row["response"]["output"])) >= 3:
            return row
    raise AssertionError("no multi-turn rollout")


def test_a_non_contiguous_turn_is_detected_and_masked(collected: tuple[list[TokenStep], Path]) -> None:
    _, out = collected
    row = _multi_turn_row(out)
    assert assemble(row).contiguous
    broken = copy.deepcopy(row)
    # a server that re-tokenized the history differently on the third call: one id of the
    # second call's generation comes back changed inside the third call's prompt
    calls = [i for i in broken["response"]["output"] if "generation_token_ids" in i]
    second_generation_at = len(calls[1]["prompt_token_ids"])
    calls[2]["prompt_token_ids"][second_generation_at] += 1
    rollout = assemble(broken)
    assert not rollout.contiguous and rollout.masked
    assert rollout.loss_mask == [0] * len(rollout.input_ids) and sum(rollout.logprobs) == 0
    assert rollout.problem is not None and rollout.problem.startswith("turn 2:")
    assert f"token {second_generation_at}" in rollout.problem
    assert rollout.reward == 1.0  # the reward is still reported; only the loss ignores it
    # ... and it is counted in its environment's step stats
    steps, _ = collected
    report = next(s.report for s in steps if s.step == row["_pg_step"]).envs[row["_pg_env"]]
    stats = env_token_stats(report, [rollout, assemble(row)])
    assert stats.masked == 1 and stats.non_contiguous == 1 and stats.generated_tokens > 0


def test_untrainable_rollouts_are_masked_not_raised() -> None:
    no_tokens = {"reward": 1.0, "response": {"output": [{"type": "message", "content": "hi"}]}}
    rollout = assemble(no_tokens, env="e")
    assert rollout.masked and rollout.contiguous and "token ids" in (rollout.problem or "")
    mismatch = {
        "reward": 0.5,
        "_ng_task_index": 7,
        "response": {
            "status": "incomplete",
            "output": [
                {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1]}
            ],
        },
    }
    rollout = assemble(mismatch, env="e")
    assert rollout.masked and rollout.group_id == 7 and rollout.truncated
    assert rollout.input_ids == [1, 2, 3, 4] and rollout.loss_mask == [0, 0, 0, 0]
    assert rollout.reward == 0.5


def call(prompt: list[int], generated: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {"prompt_token_ids": prompt, "generation_token_ids": generated, "generation_log_probs": logprobs}


def test_two_turns_assemble_with_environment_tokens_between() -> None:
    row = {
        "reward": 0.25,
        "score_a": 1,
        "question": 3,
        "response": {
            "output": [
                call([1, 2], [3, 4], [-1, -2]),
                {"type": "function_call_output"},
                call([1, 2, 3, 4, 9], [5], [-3]),
            ]
        },
    }
    rollout = assemble(row, env="e", input_keys={"question"})
    assert rollout.input_ids == [1, 2, 3, 4, 9, 5]
    assert rollout.loss_mask == [0, 0, 1, 1, 0, 1]
    assert rollout.logprobs == [0.0, 0.0, -1.0, -2.0, 0.0, -3.0]
    assert rollout.prompt_length == 2 and rollout.num_turns == 2
    assert rollout.completion_mask == [1, 1, 0, 1]
    assert rollout.reward_components == {"score_a": 1.0}


def test_turns_rendered_anew_are_counted_and_a_drift_names_the_servers_reason() -> None:
    exact = {**call([1, 2, 3, 4, 9], [5], [-3]), "prompt_continuation": {"exact": True}}
    first = call([1, 2], [3, 4], [-1, -2])
    rollout = assemble({"response": {"output": [first, exact]}}, env="e")
    assert rollout.retemplated_turns == 0 and not rollout.masked
    plain = assemble({"response": {"output": [first, call([1, 2, 3, 4, 9], [5], [-3])]}}, env="e")
    assert plain.retemplated_turns == 1 and not plain.masked  # re-rendered, but it happened to match
    stamp = {"exact": False, "reason": "no clean suffix"}
    drifted = {**call([1, 2, 3, 7, 9], [5], [-3]), "prompt_continuation": stamp}
    rollout = assemble({"response": {"output": [first, drifted]}}, env="e")
    assert rollout.masked and rollout.retemplated_turns == 1
    assert rollout.problem is not None and rollout.problem.endswith("retokenized history: no clean suffix)")


def test_group_advantages_match_hand_computed_values() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0, 2.0]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c", "c", "d"]
    # group a: mean 0.5, population std 0.5 -> +-1; group b: all equal -> 0;
    # group c: mean 0.5, population std sqrt(1/6) -> 0, -sqrt(1.5), +sqrt(1.5); group d alone -> 0
    expected = [1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, -math.sqrt(1.5), math.sqrt(1.5), 0.0]
    got = group_advantages(rewards, groups, eps=0.0)
    assert got == pytest.approx(expected)
    # sample std (ddof=1), as TRL uses: group a std = sqrt(1/3) -> +-sqrt(3)/2
    got = group_advantages(rewards, groups, eps=0.0, ddof=1)
    half = math.sqrt(3) / 2
    assert got[:4] == pytest.approx([half, -half, -half, half])
    assert got[7:9] == pytest.approx([-1.0, 1.0])  # group c: sample std 0.5
    # no std division (Dr. GRPO): just the centered rewards
    assert group_advantages(rewards, groups, scale="none") == pytest.approx(
        [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, -0.5, 0.5, 0.0]
    )
    # one std for the whole batch: population std of all ten rewards
    mean = sum(rewards) / 10
    batch_std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 10)
    got = group_advantages(rewards, groups, scale="batch", eps=0.0)
    assert got[0] == pytest.approx(0.5 / batch_std) and got[7] == pytest.approx(-0.5 / batch_std)
    # groups are found by id, not by position
    assert group_advantages([0.0, 1.0, 1.0, 0.0], [1, 2, 1, 2], eps=0.0) == [-1.0, 1.0, 1.0, -1.0]
    assert zero_variance_groups(rewards, groups) == (2, 4)
    with pytest.raises(ValueError, match="group ids"):
        group_advantages([1.0], [])
    with pytest.raises(ValueError, match="finite"):
        group_advantages([math.nan, 1.0], [0, 0])


def test_collector_continues_and_jumps_steps(tmp_path: Path) -> None:
    blend = load_blend(spec(tmp_path))
    out = tmp_path / "jump.jsonl"
    with TokenCollector(blend, out, stack_config=stack_config()) as collector:
        first = collector.step()
        again = collector.step(0)  # start over: same rows, same groups
        third = collector.step(2)
    assert first.step == again.step == 0 and third.step == 2
    assert [r.group_id for r in first.rollouts] == [r.group_id for r in again.rollouts]
    assert {r.group_id for r in third.rollouts} == {8, 9, 10, 11}
    steps_file = [line["step"] for line in iter_jsonl(StepFiles(out).steps)]
    assert sorted(set(steps_file)) == [0, 2]


def test_collector_needs_exactly_one_stack(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TokenCollector(load_blend(spec(tmp_path)), tmp_path / "x.jsonl")


def test_turns_cut_at_the_token_limit_are_counted_per_turn_and_per_rollout() -> None:
    """A game whose every turn hit max_output_tokens still ends "completed": it is truncated."""
    game = {
        "reward": 0.0,
        "responses_create_params": {"input": [], "max_output_tokens": 2},
        "response": {
            "status": "completed",
            "output": [call([1, 2], [3, 4], [-1, -2]), call([1, 2, 3, 4, 9], [5, 6], [-1, -1])],
        },
    }
    rollout = assemble(game, env="g")
    assert rollout.truncated_turns == 2 and rollout.truncated and not rollout.masked
    short = {**game, "responses_create_params": {"input": [], "max_output_tokens": 8}}
    assert assemble(short, env="g").truncated_turns == 0 and not assemble(short, env="g").truncated
    unlimited = {**game, "responses_create_params": {"input": []}}
    assert assemble(unlimited, env="g").truncated_turns == 0


def test_plan_token_weights_make_the_weighted_share_the_plan() -> None:
    from polygym.training.advantages import plan_token_weights

    tokens = {"long": 710, "short": 290, "idle": 0}
    weights = plan_token_weights(tokens, {"long": 0.5, "short": 0.3, "idle": 0.2})
    weighted = {env: tokens[env] * w for env, w in weights.items()}
    total = sum(weighted.values())
    assert total == pytest.approx(1000)  # loss scale kept
    assert weighted["long"] / total == pytest.approx(0.5 / 0.8) and weighted[
        "short"
    ] / total == pytest.approx(0.3 / 0.8)
    assert weights["idle"] == 1.0
    assert plan_token_weights({"a": 5}, {"a": 0.0}) == {"a": 1.0}


def _env_sums(batch: dict[str, list[Any]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for env, mask in zip(batch["polygym_env"], batch["env_mask"], strict=True):
        sums[env] = sums.get(env, 0.0) + sum(mask)
    return sums


def test_token_shares_are_reported_and_plan_normalization_follows_the_plan(
    collected: tuple[list[TokenStep], Path], tmp_path: Path
) -> None:
    """A multi-step tool episode trains more tokens than a single tool call from the same number of
    prompts: the step reports each share as counted, and gradient_share="plan" weighs them back."""
    step = collected[0][1]
    # never started: the adapter only reads its blend and sampling
    collector = TokenCollector(spec(tmp_path), tmp_path / "unused.jsonl", head_url="http://127.0.0.1:1")
    counted = {env: sum(r.generated_tokens for r in step.rollouts if r.env == env) for env in ENVS}
    total = sum(counted.values())
    assert counted[ENVS[1]] > 1.5 * counted[ENVS[0]]  # the premise: multi-step episodes are longer
    for env, tokens in counted.items():
        stats = step.stats[env]
        assert stats.planned_share == 0.5
        assert stats.trained_token_share == pytest.approx(tokens / total)
        assert stats.gradient_share == pytest.approx(tokens / total) and stats.loss_weight == 1.0
    plain = PolygymGRPO(collector, steps=1, start_step=1).batch(step)
    assert _env_sums(plain) == pytest.approx({env: float(n) for env, n in counted.items()})

    grpo = PolygymGRPO(collector, steps=1, start_step=1, gradient_share="plan")
    grpo.weigh(step)
    weighted = _env_sums(grpo.batch(step))
    assert sum(weighted.values()) == pytest.approx(total)  # the loss scale is unchanged
    for env in counted:
        assert weighted[env] / total == pytest.approx(0.5)
        assert step.stats[env].gradient_share == pytest.approx(0.5)
        assert step.stats[env].trained_token_share == pytest.approx(counted[env] / total)
    assert step.metrics()["polygym/example_single_tool_call/gradient_share"] == pytest.approx(0.5)


def test_rollouts_carry_their_log_prob_semantics_and_a_mixed_step_is_refused(
    collected: tuple[list[TokenStep], Path],
) -> None:
    steps, _ = collected
    scripted = {"source": "scripted", "temperature": None, "processed": "none"}
    assert all(r.logprob_semantics == scripted for s in steps for r in s.rollouts)
    assert steps[0].logprob_semantics == [scripted] and steps[0].log_lines()[0]["logprob_semantics"] == [
        scripted
    ]

    report = copy.deepcopy(steps[0].report)
    vllm = {"source": "vllm", "temperature": 1.0, "processed": "raw"}
    victim = next(r for r in report.rollouts if r[ENV_FIELD] == ENVS[1])
    for item in victim["response"]["output"]:
        if LOGPROB_SEMANTICS_FIELD in item:
            item[LOGPROB_SEMANTICS_FIELD] = vllm
    with pytest.raises(
        MixedLogprobSemanticsError, match=r"step 0 mixes log-probs.*'vllm'.*example_multi_step"
    ):
        token_step(report)
    mixed = token_step(report, allow_mixed_semantics=True)
    assert mixed.logprob_semantics == [scripted, vllm]

    # one rollout whose turns disagree is masked: its log-probs are not one distribution's
    calls = [i for i in victim["response"]["output"] if LOGPROB_SEMANTICS_FIELD in i]
    assert len(calls) > 1
    calls[0][LOGPROB_SEMANTICS_FIELD] = scripted
    rollout = assemble(victim)
    assert rollout.masked and "log-probs taken as" in (rollout.problem or "") and sum(rollout.loss_mask) == 0


def test_vllm_upstream_semantics_default_to_vllm_raw_log_probs() -> None:
    from responses_api_models.vllm_model.app import upstream_semantics

    assert upstream_semantics({}, {"temperature": 0.7}) == {
        "source": "vllm",
        "temperature": 0.7,
        "processed": "raw",
    }
    stated = {"source": "hf_generate", "temperature": 0.7, "processed": "sampling_distribution"}
    assert upstream_semantics({"logprob_semantics": stated}, {"temperature": 0.7}) == stated


def test_log_prob_semantics_are_stripped_with_the_token_fields_before_an_upstream_sees_them() -> None:
    from polygym.token_fields import attach_token_fields, strip_token_fields

    output = [{"type": "message", "role": "assistant", "content": []}]
    attach_token_fields(output, [1], [2], [-0.5], {"source": "vllm", "temperature": 1.0, "processed": "raw"})
    assert strip_token_fields(output) == [{"type": "message", "role": "assistant", "content": []}]
