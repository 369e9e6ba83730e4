"""``gradient_share="plan"``: the weights TRL's loss applies equal the plan, whatever the first row is.

TRL pads ``env_mask`` rows into one tensor of the *first* row's dtype, so an integer first row (a
failed or late first slot's placeholder, or a first environment with no trained tokens) once
truncated every environment's fractional weight to a whole number while the logs showed the plan.
These tests read the mask the loss multiplies by (``completion_mask x tool_mask`` as
``_generate_and_score_completions`` hands it to ``_compute_loss``), not polygym's own bookkeeping.

The three cases reach ``PolygymGRPO.batch`` exactly as the collector delivers them: a failed or
straggling rollout is absent from the step (``stepwise`` records it in the failures file), a rollout
with no trained tokens carries an all-zero loss mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from polygym.blend.spec import parse_spec
from polygym.row import ALL_ENVS
from polygym.training.collector import TokenCollector, TokenStep, env_token_stats
from polygym.training.generation_server import GenerationServerThread, HFGenerator
from polygym.training.models import tiny_policy
from polygym.training.run import stack_config
from polygym.training.tokens import TokenRollout
from polygym.training.trl_adapter import PolygymGRPO

Edit = Callable[[TokenStep, list[str]], list[TokenRollout]]


def by_position(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards 0, 1 within each group of 2: every group has an advantage, whatever was sampled."""
    return [float(i % 2) for i in range(len(completions))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("plan_weights")
    games = tmp / "games.jsonl"  # multi-turn: more trained tokens per rollout than the others
    games.write_text(
        '{"responses_create_params": {"input": [{"role": "system", "content": "Guess."}]}, '
        '"game": {"low": 1, "high": 4, "secret": 3, "max_guesses": 3}}\n'
    )
    spec = parse_spec(
        {
            "environments": [
                {"name": "mcqa", "weight": 2},
                {"name": "keyword_constraints", "weight": 1},
                {
                    "name": "guess_number",
                    "agent": "guess_number_gymnasium_agent",
                    "train": [str(games)],
                    "weight": 1,
                },
            ],
            "prompts_per_step": 4,
            "responses_per_prompt": 2,
            "seed": 3,
        },
        "test",
        tmp,
    )
    model, tokenizer = tiny_policy(seed=2)
    with GenerationServerThread(HFGenerator(model, tokenizer)) as server:
        config = stack_config(spec, server.url, [], [])
        sampling = {"max_output_tokens": 8, "temperature": 1.0}
        with TokenCollector(
            spec, tmp / "rollouts.jsonl", stack_config=config, sampling=sampling
        ) as collector:
            yield {"tmp": tmp, "model": model, "tokenizer": tokenizer, "collector": collector}


class EditedCollector:
    """The real collector, with each step's rollouts edited as a failure or a masked env leaves them."""

    def __init__(self, collector: TokenCollector, edit: Edit) -> None:
        self._collector = collector
        self._edit = edit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)

    def step(self, number: int | None = None) -> TokenStep:
        step = self._collector.step(number)
        slots = [
            item.env
            for item in self._collector.blend.sampler(self._collector.blend.plan()).step(step.step).items
        ]
        rollouts = self._edit(step, slots)
        stats = {
            env: env_token_stats(s, [r for r in rollouts if r.env == env])
            for env, s in step.stats.items()
            if env != ALL_ENVS
        }
        stats[ALL_ENVS] = env_token_stats(step.total, rollouts)
        edited = TokenStep(step.step, rollouts, stats, step.report, step.off_policy)
        edited.set_loss_weights({})
        return edited


def slot_of(step: TokenStep, rollout: TokenRollout) -> int:
    return step.report.slots[rollout.group_id]


def failed_first_slot(step: TokenStep, slots: list[str]) -> list[TokenRollout]:
    """Every response of slot 0 failed: none reaches the trainer."""
    return [r for r in step.rollouts if slot_of(step, r) != 0]


def straggler_first(step: TokenStep, slots: list[str]) -> list[TokenRollout]:
    """The first response of slot 0 missed the step deadline; its sibling arrived."""
    return [r for r in step.rollouts if (slot_of(step, r), r.rollout_index) != (0, 0)]


def first_env_untrained(step: TokenStep, slots: list[str]) -> list[TokenRollout]:
    """Every rollout of the first environment came back masked: no trained token from it."""
    return [
        replace(r, loss_mask=[0] * len(r.loss_mask), masked=True, problem="test: masked")
        if r.env == slots[0]
        else r
        for r in step.rollouts
    ]


def nothing(step: TokenStep, slots: list[str]) -> list[TokenRollout]:
    return list(step.rollouts)


def applied_weights(setup: dict[str, Any], edit: Edit) -> tuple[dict[str, float], dict[str, float], float]:
    """One real GRPO step with ``gradient_share="plan"``: each environment's total of the mask the
    loss applies, each environment's planned share (over those that trained), and the step's
    trained tokens."""
    grpo = PolygymGRPO(EditedCollector(setup["collector"], edit), steps=1, gradient_share="plan")  # type: ignore[arg-type]
    trainer = grpo.trainer(
        setup["model"],
        setup["tokenizer"],
        grpo.grpo_config(setup["tmp"] / "t"),
        extra_reward_funcs=[by_position],
    )
    seen: list[dict[str, Any]] = []
    generate = trainer._generate_and_score_completions

    def capture(batch: Any) -> Any:
        output = generate(batch)
        seen.append(output)
        return output

    trainer._generate_and_score_completions = capture
    trainer.train()
    assert len(seen) == 1 and len(grpo.history) == 1
    step = grpo.history[0]
    mask = seen[0]["completion_mask"] * seen[0]["tool_mask"]
    assert mask.is_floating_point()  # an integer mask is what truncated the weights
    rows = [item.env for item in grpo.sampler.step(step.step).items for _ in range(grpo.responses_per_prompt)]
    applied: dict[str, float] = {}
    for env, row in zip(rows, mask.sum(dim=1).tolist(), strict=True):
        applied[env] = applied.get(env, 0.0) + row
    trained = {env: s for env, s in step.stats.items() if env != ALL_ENVS and s.generated_tokens > 0}
    share_sum = sum(s.planned_share for s in trained.values())
    planned = {env: s.planned_share / share_sum for env, s in trained.items()}
    return applied, planned, float(step.total.generated_tokens)


@pytest.mark.parametrize("edit", [nothing, failed_first_slot, straggler_first, first_env_untrained])
def test_the_loss_applies_the_planned_shares(setup: dict[str, Any], edit: Edit) -> None:
    applied, planned, trained = applied_weights(setup, edit)
    total = sum(applied.values())
    assert total == pytest.approx(trained, rel=1e-5)  # the step's total weight stays its token count
    assert len(planned) >= 2  # the case weighs at least two environments against each other
    for env, share in planned.items():
        assert applied[env] / total == pytest.approx(share, abs=1e-5), (env, applied, planned)
    for env in set(applied) - set(planned):
        assert math.isclose(applied[env], 0.0, abs_tol=1e-9)  # nothing trained, nothing applied
