"""TRL's NeMo Gym rollout path and its ``GRPOTrainer`` against a real `gym env start`.

The policy is polygym's tiny in-code model served by ``GenerationServerThread`` (vLLM's token-id
extensions, exact prefixes); the stack is a separate `gym env start` process serving two multi-turn
environments (the shipped ``guess_number`` and a three-turn test game whose reward varies with
what a random model says, so a GRPO group has an advantage to follow). TRL finds the agents through
the head's ``/global_config_dict_yaml`` and posts each row to ``/run``, as its example does.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.trainers.stacks import (
    agent_row,
    game_row,
    token_stack_args,
    trl_example,
    write_environments,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")


@pytest.fixture
def policy() -> Iterator[Any]:
    """The tiny model behind a generation server: ``(model, tokenizer, server)``."""
    from polygym.training.generation_server import GenerationServerThread, HFGenerator
    from polygym.training.models import tiny_policy

    model, tokenizer = tiny_policy(seed=3)
    with GenerationServerThread(HFGenerator(model, tokenizer, default_max_tokens=6), "policy") as server:
        yield model, tokenizer, server


def head_url(stack: Any) -> str:
    return str(stack.record["head_url"])


def scored_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """The model's log-prob of every completion token given everything before it (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_grpo_trainer_trains_one_step_through_a_polygym_stack(
    tmp_path: Path, policy: Any, start_stack: Callable[..., Any]
) -> None:
    model, tokenizer, server = policy
    example = trl_example()
    write_environments(tmp_path, "tally")
    stack = start_stack(*token_stack_args(server.url, "guess_number", "tally"), cwd=tmp_path)
    agents = example.agent_urls(head_url(stack))
    assert {"guess_number_gymnasium_agent", "tally_gymnasium_agent"} <= set(agents)

    rows = [
        game_row(2),
        agent_row("tally_gymnasium_agent"),
        game_row(7),
        agent_row("tally_gymnasium_agent"),
    ]
    dataset = example.dataset_rows(rows)
    inner = example.make_rollout_func(agents, dataset, timeout_s=120)
    batches: list[tuple[list[Any], dict[str, list[Any]]]] = []

    def recording(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        out = inner(prompts, trainer)
        batches.append((list(prompts), out))
        return out

    initial = copy.deepcopy(model).eval()  # the weights that sample the step's rollouts
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, generation_batch_size=8,
        num_generations=2, max_steps=1, max_completion_length=6, learning_rate=0.05, beta=0.0,
        shuffle_dataset=False, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=1,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=example.env_reward,
        train_dataset=dataset,
        rollout_func=recording,
        args=args,
    )
    trainer.train()

    # one generation batch: the 4 prompts in file order (shuffle_dataset=False), each twice
    [(prompts, out)] = batches
    assert prompts == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert out["env_failure"] == [None] * 8
    assert all(turns >= 1 for turns in out["num_turns"][0::4]) and out["num_turns"][2::4] == [3, 3]
    assert sum(out["num_turns"]) > len(out["num_turns"])  # multi-turn: observations between turns
    for completion, mask, logprobs in zip(
        out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
    ):
        assert len(completion) == len(mask) == len(logprobs)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        assert all(lp < 0.0 for lp, m in zip(logprobs, mask, strict=True) if m)
    # the log-probs are the sampling policy's (the weights before the step), token for token
    for prompt, completion, mask, logprobs in zip(
        out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
    ):
        scored = scored_logprobs(initial, prompt, completion)
        generated = [(s, lp) for s, lp, m in zip(scored, logprobs, mask, strict=True) if m]
        assert generated and all(math.isclose(s, lp, abs_tol=1e-3) for s, lp in generated)
    # rewards vary inside a group (tally's replies differ), so the step had a gradient, and the
    # optimizer took it
    tally_groups = [out["env_reward"][i : i + 2] for i in (2, 6)]
    assert any(len(set(group)) == 2 for group in tally_groups), tally_groups
    assert trainer.state.global_step == 1
    initial_weights = dict(initial.named_parameters())
    assert any(not torch.equal(initial_weights[name], p.detach()) for name, p in model.named_parameters())


def test_failures_reach_trl_as_failures_not_rewards(
    tmp_path: Path, policy: Any, start_stack: Callable[..., Any]
) -> None:
    _, _, server = policy
    example = trl_example()
    write_environments(tmp_path, "parity", "boom")
    # one attempt at the policy server, so its death is reported at once
    once = ("policy_model.responses_api_models.vllm_model.max_attempts=1",)
    stack = start_stack(*token_stack_args(server.url, "parity", "boom", overrides=once), cwd=tmp_path)
    agents = example.agent_urls(head_url(stack))

    # a row for an agent the stack does not run: refused before anything is sent
    with pytest.raises(ValueError, match=r"agent 'nope'.*boom_simple_agent"):
        asyncio.run(example.run_rows([agent_row("nope")], agents, 30))

    # a verifier that raises: that rollout is a typed failure with no reward; the others train
    rows = [agent_row("boom_simple_agent", explode=True), agent_row("parity_gymnasium_agent")]
    results = asyncio.run(example.run_rows(rows, agents, 60))
    assert isinstance(results[0], example.RolloutFailure) and results[0].kind == "HTTP 500"
    assert "verifier exploded on purpose" in str(results[0])
    out = example.rollout_outputs(results, pad_id=0)
    assert out["env_reward"][0] is None and out["env_failure"][0] == results[0].kind
    assert out["env_mask"][0] == [0]
    assert out["env_failure"][1] is None and isinstance(out["env_reward"][1], float)

    # the policy server dies: every rollout fails with its class, and the batch is refused
    server.stop()
    dead = asyncio.run(example.run_rows([agent_row("parity_gymnasium_agent")] * 2, agents, 60))
    assert all(isinstance(r, example.RolloutFailure) for r in dead)
    assert [r.kind for r in dead] == ["ConnectionRefused"] * 2  # polygym's class, from its header
    with pytest.raises(RuntimeError, match="every rollout of the batch failed"):
        example.rollout_outputs(dead, pad_id=0)

    # a dead agent: the connection itself fails, typed, never a reward
    stack.stop()
    gone = asyncio.run(example.run_rows([agent_row("parity_gymnasium_agent")], agents, 10))
    assert isinstance(gone[0], example.RolloutFailure) and gone[0].kind == "ClientConnectorError"


def test_a_retokenized_history_is_a_typed_failure() -> None:
    """A later turn whose prompt does not extend what was generated (a template re-rendered it)."""
    example = trl_example()
    turn = {
        "type": "message",
        "prompt_token_ids": [1, 2],
        "generation_token_ids": [3],
        "generation_log_probs": [-0.1],
    }
    drifted = {**turn, "prompt_token_ids": [1, 2, 4, 5], "generation_token_ids": [6]}
    with pytest.raises(example.RolloutFailure, match="Non-contiguous messages") as caught:
        example.trajectory({"response": {"output": [turn, drifted]}, "reward": 1.0})
    assert caught.value.kind == example.NON_CONTIGUOUS_KIND
    extended = {**turn, "prompt_token_ids": [1, 2, 3, 7], "generation_token_ids": [8]}
    rows = [
        {"response": {"output": [turn, drifted]}, "reward": 1.0},
        {"response": {"output": [turn, extended]}, "reward": 0.5},
    ]
    out = example.rollout_outputs(rows, pad_id=0)
    assert out["env_failure"] == ["non_contiguous", None] and out["env_reward"] == [None, 0.5]
    assert out["completion_ids"][1] == [3, 7, 8] and out["env_mask"][1] == [1, 0, 1]
    assert out["logprobs"][1] == [-0.1, 0.0, -0.1]
