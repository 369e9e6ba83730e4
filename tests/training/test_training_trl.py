"""TRL's GRPOTrainer on a polygym blend, one real optimizer step end to end on the CPU.

Needs the training extra (``pip install -e '.[train]'``); skipped without it. The policy is a
random two-layer Llama with a byte-level tokenizer built in code (``models.tiny_policy``): no
download, no weights package, a few seconds in all. It is served by the generation server behind
``vllm_model``, so the step exercises the whole path: TRL asks for a generation batch, polygym
collects the blend's step (mcqa single-turn, guess_number multi-turn) from the weights being
trained, TRL computes advantages and updates those weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import torch

from polygym.blend.dynamic_sampling import DynamicSampling
from polygym.blend.spec import parse_spec
from polygym.training.collector import TokenCollector, TokenStep
from polygym.training.env_metrics import validation_metrics
from polygym.training.generation_server import GenerationServerThread, HFGenerator
from polygym.training.models import tiny_policy, train_top_layers
from polygym.training.run import stack_config
from polygym.training.run_report import plot_curves
from polygym.training.trl_adapter import PolygymGRPO, polygym_reward, prompt_messages


def rank_bonus(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Extra shaping reward for the test: a random policy rarely scores, so every group gets
    rewards 0, 0.1, 0.2 by position (TRL groups consecutive completions): a nonzero advantage
    whatever the tiny model samples, hence an update to check (a text-based bonus was flaky)."""
    return [(i % 3) / 10 for i in range(len(completions))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("trl")
    games = tmp / "games.jsonl"
    games.write_text(
        '{"responses_create_params": {"input": [{"role": "system", "content": "Guess."}], '
        '"max_output_tokens": 6}, "game": {"low": 1, "high": 4, "secret": 3, "max_guesses": 2}}\n'
    )
    spec = parse_spec(
        {
            "environments": [
                {"name": "mcqa"},
                {"name": "guess_number", "agent": "guess_number_gymnasium_agent", "train": [str(games)]},
            ],
            "prompts_per_step": 2,
            "responses_per_prompt": 3,
            "seed": 11,
        },
        "test",
        tmp,
    )
    model, tokenizer = tiny_policy(seed=1)
    generator = HFGenerator(model, tokenizer)
    with GenerationServerThread(generator) as server:
        config = stack_config(spec, server.url, [], [])
        sampling = {"max_output_tokens": 8, "temperature": 1.0}
        with TokenCollector(
            spec, tmp / "rollouts.jsonl", stack_config=config, sampling=sampling
        ) as collector:
            yield {
                "tmp": tmp,
                "model": model,
                "tokenizer": tokenizer,
                "generator": generator,
                "collector": collector,
                "config": config,
            }


def test_one_grpo_step_end_to_end(setup: dict[str, Any]) -> None:
    model, tokenizer, collector = setup["model"], setup["tokenizer"], setup["collector"]
    trainable = train_top_layers(model, 1)
    assert 0 < trainable < sum(p.numel() for p in model.parameters())
    top = model.model.layers[-1].mlp.down_proj.weight
    frozen = model.model.layers[0].mlp.down_proj.weight
    top_before, frozen_before = top.detach().clone(), frozen.detach().clone()
    seen: list[TokenStep] = []
    grpo = PolygymGRPO(collector, steps=1, on_step=seen.append)
    args = grpo.grpo_config(setup["tmp"] / "trainer", learning_rate=1e-2)
    assert args.generation_batch_size == 6 and args.num_generations == 3 and not args.shuffle_dataset
    trainer = grpo.trainer(model, tokenizer, args, extra_reward_funcs=[rank_bonus])
    trainer.train()

    assert trainer.state.global_step == 1 and len(seen) == 1
    step = seen[0]
    assert step.step == 0 and {r.env for r in step.rollouts} == {"mcqa", "guess_number"}
    assert setup["generator"].stats.sequences >= 6  # every rollout came from the served weights
    log = trainer.state.log_history[0]
    # per-environment metrics next to TRL's own
    assert log["polygym/mcqa/realized_share"] == log["polygym/guess_number/realized_share"] == 0.5
    assert log["polygym/all/completed"] == 6
    assert "polygym/guess_number/reward_mean" in log and "loss" in log
    assert log["polygym/guess_number/turns_mean"] >= 1
    # the update moved the trained block and left the frozen one alone
    assert not torch.equal(top.detach(), top_before)
    assert torch.equal(frozen.detach(), frozen_before)


def test_batch_layout_matches_trl_order(setup: dict[str, Any]) -> None:
    collector = setup["collector"]
    grpo = PolygymGRPO(collector, steps=1, start_step=3)
    step = collector.step(3)
    batch = grpo.batch(step, pad_id=0)
    assert len(batch["prompt_ids"]) == 6 and batch["polygym_env"][:3] == [step.rollouts[0].env] * 3
    tasks = [3 * 2 + i for i in range(2) for _ in range(3)]
    by_key = {(r.group_id, r.rollout_index): r for r in step.rollouts}
    for k, task in enumerate(tasks):
        rollout = by_key[(task, k % 3)]
        assert batch["prompt_ids"][k] + batch["completion_ids"][k] == rollout.input_ids
        assert batch["env_mask"][k] == rollout.completion_mask
        assert len(batch["logprobs"][k]) == len(batch["completion_ids"][k])
        assert batch["polygym_reward"][k] == rollout.reward
    # the generation server states how it took the log-probs, vllm_model passes it on
    sampled = {
        "source": "hf_generate",
        "temperature": 1.0,
        "processed": "sampling_distribution",
        "top_p": 1.0,
        "top_k": 0,
    }
    assert step.logprob_semantics == [sampled]
    games = [r for r in step.rollouts if r.env == "guess_number" and r.num_turns > 1 and not r.masked]
    for rollout in games:  # environment turns sit inside the completion with mask 0
        assert 0 in rollout.completion_mask and rollout.completion_mask[0] == 1


def test_misaligned_prompts_and_configs_are_refused(setup: dict[str, Any]) -> None:
    collector = setup["collector"]
    grpo = PolygymGRPO(collector, steps=2)
    with pytest.raises(RuntimeError, match="not step 0"):
        grpo.rollout_func([[{"role": "user", "content": "something else"}]] * 6, trainer=None)
    rows = grpo.train_dataset()
    assert len(rows) == 4 and rows[0]["prompt"] == prompt_messages(grpo.sampler.step(0).items[0].row)
    with pytest.raises(ValueError, match="shuffle_dataset"):
        grpo.trainer(
            setup["model"], setup["tokenizer"], grpo.grpo_config(setup["tmp"] / "t", shuffle_dataset=True)
        )
    assert polygym_reward([], [], polygym_reward=[1.0, None, float("nan")]) == [1.0, None, None]


def test_a_step_split_over_two_optimizer_steps_is_refused(setup: dict[str, Any]) -> None:
    """A smaller per-device batch would train the second half of a step off-policy: refused."""
    grpo = PolygymGRPO(setup["collector"], steps=2)
    batch = grpo.prompts_per_step * grpo.responses_per_prompt
    halved = grpo.grpo_config(setup["tmp"] / "t", per_device_train_batch_size=batch // 2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps x world_size must be"):
        grpo.trainer(setup["model"], setup["tokenizer"], halved)
    accumulated = grpo.grpo_config(
        setup["tmp"] / "t", per_device_train_batch_size=batch // 2, gradient_accumulation_steps=2
    )
    assert accumulated.per_device_train_batch_size * accumulated.gradient_accumulation_steps == batch
    grpo._check_args(accumulated)  # the same step in two micro-batches is one optimizer step: fine


def test_training_log_probs_use_the_sampling_temperature(setup: dict[str, Any]) -> None:
    """The sampling temperature reaches TRL's config; a different one is refused."""
    collector = setup["collector"]
    original = collector.sampling
    try:
        collector.sampling = {**original, "temperature": 0.7}
        grpo = PolygymGRPO(collector, steps=2)
        assert grpo.grpo_config(setup["tmp"] / "t").temperature == pytest.approx(0.7)
        mismatched = grpo.grpo_config(setup["tmp"] / "t", temperature=1.0)
        with pytest.raises(ValueError, match=r"temperature must be the sampling temperature 0\.7"):
            grpo.trainer(setup["model"], setup["tokenizer"], mismatched)
    finally:
        collector.sampling = original


def test_plot_from_a_log_draws_every_validation_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    log = tmp_path / "log.jsonl"
    lines = [
        {"step": s, "env": env, "reward_mean": r, "realized_share": 0.5}
        for s in range(6)
        for env, r in (("a", s / 10), ("b", 1 - s / 10), ("_all", 0.5))
    ]
    log.write_text("".join(__import__("json").dumps(line) + "\n" for line in lines))
    drawn: dict[str, list[float]] = {}
    save = Figure.savefig

    def capture(figure: Figure, *args: Any, **kwargs: Any) -> None:
        for line in figure.axes[0].get_lines():
            drawn[str(line.get_label())] = [float(x) for x in list(line.get_xdata())]  # type: ignore[arg-type]
        save(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    validation = {0: {"a": 0.1, "b": 0.9, "watched": 0.5}, 2: {"a": 0.3, "b": 0.8, "watched": 0.4}}
    validation[5] = {"a": 0.5, "b": 0.4, "watched": math.nan}  # nothing scored: no point
    plot_curves(log, tmp_path / "c.png", validation)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    label = "validation (greedy, after N updates)"
    assert drawn[f"a {label}"] == drawn[f"b {label}"] == [0, 2, 5]  # every validation, not before/after
    assert drawn[f"watched {label}"] == [0, 2]  # an eval_only environment, never trained, drawn too
    assert drawn["a (train, 5-step mean)"] == [0, 1, 2, 3, 4, 5]


def test_plan_normalization_trains_and_refuses_a_per_sequence_loss(setup: dict[str, Any]) -> None:
    model, tokenizer, collector = setup["model"], setup["tokenizer"], setup["collector"]
    grpo = PolygymGRPO(collector, steps=1, start_step=8, gradient_share="plan")
    with pytest.raises(ValueError, match="gradient_share='plan' needs a token-summed loss_type"):
        grpo.trainer(model, tokenizer, grpo.grpo_config(setup["tmp"] / "t", loss_type="grpo"))
    trainer = grpo.trainer(
        model, tokenizer, grpo.grpo_config(setup["tmp"] / "t"), extra_reward_funcs=[rank_bonus]
    )
    trainer.train()  # TRL takes the weighted (float) env_mask
    log = trainer.state.log_history[0]
    shares = [
        log[f"polygym/{env}/gradient_share"]
        for env in ("mcqa", "guess_number")
        if f"polygym/{env}/gradient_share" in log
    ]
    assert sum(shares) == pytest.approx(1.0) and math.isfinite(log["loss"])
    with pytest.raises(ValueError, match="gradient_share must be one of"):
        PolygymGRPO(collector, steps=1, gradient_share="equal")  # type: ignore[arg-type]


@pytest.mark.slow
def test_every_log_record_carries_per_environment_metrics_for_report_to(setup: dict[str, Any]) -> None:
    """What a report_to backend (W&B, TensorBoard...) receives: a callback's ``on_log`` sees exactly the
    records they see. With dynamic sampling on, its draws are there too, and the batch keeps its layout."""
    from transformers import TrainerCallback

    class Capture(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append(dict(logs or {}))

    capture, seen = Capture(), list[TokenStep]()
    blend = setup["collector"].blend
    sampling = {"max_output_tokens": 4, "temperature": 1.0}
    output = setup["tmp"] / "dynamic.jsonl"
    dynamic = DynamicSampling(1)
    with TokenCollector(
        blend, output, stack_config=setup["config"], sampling=sampling, dynamic_sampling=dynamic
    ) as collector:
        grpo = PolygymGRPO(collector, steps=1, on_step=seen.append)
        grpo.log_metrics(validation_metrics({"mcqa": 0.25, "guess_number": math.nan}))
        trainer = grpo.trainer(setup["model"], setup["tokenizer"], grpo.grpo_config(setup["tmp"] / "t2"))
        trainer.add_callback(capture)
        trainer.train()
    record = capture.logs[0]
    names = ("reward", "tokens", "generated_tokens", "truncated_share", "zero_variance_share", "masked_share")
    for env in ("mcqa", "guess_number", "all"):
        for name in (*names, "dynamic/extra_prompts", "dynamic/zero_variance_dropped", "dynamic/unfilled"):
            assert f"polygym/{env}/{name}" in record, (env, name)
    assert record["polygym/mcqa/validation_reward"] == 0.25
    assert "polygym/guess_number/validation_reward" not in record  # no mean, no point
    assert "loss" in record and {**record, "step": 1} == trainer.state.log_history[0]
    step = seen[0]
    assert step.report.dynamic is not None
    assert record["polygym/mcqa/dynamic/extra_prompts"] == step.report.dynamic["mcqa"].extra_prompts
    batch = grpo.batch(step)
    assert batch["polygym_env"] == ["mcqa"] * 3 + ["guess_number"] * 3  # one group per planned slot
