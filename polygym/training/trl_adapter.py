"""TRL's ``GRPOTrainer`` trained on a polygym blend (``pip install -e '.[train]'``, TRL 1.16).

TRL 1.16 offers two hooks for environments: ``environment_factory`` (TRL runs the conversation
itself and calls the environment's Python methods as tools) and ``rollout_func`` (the caller
produces the completions and their token ids). polygym environments are servers driven by their
own agents — their tool loops, game turns, session state and verifiers — so the fitting hook is
``rollout_func``: for every generation batch, ``PolygymGRPO.rollout_func`` collects the blend's next
step through polygym (``TokenCollector``) and hands TRL the token-level rollouts.

How a step maps onto TRL:

- **The blend spec decides each step's mix.** ``train_dataset()`` lists the prompts of steps
  ``0 .. steps-1`` in the step sampler's order, and ``grpo_config()`` makes TRL read them in that
  order (``shuffle_dataset=False``), one step per generation batch (``generation_batch_size =
  prompts_per_step x responses_per_prompt``, ``num_generations = responses_per_prompt``). The
  rollout function checks that the prompts TRL passes are the step's prompts, so a config that
  breaks the alignment fails loudly instead of training on mismatched data.
- **Completions**: ``prompt_ids`` is the first model call's prompt; ``completion_ids`` the rest of
  the episode (every model turn and every tool/environment turn); ``env_mask`` is the loss mask
  over it (TRL trains only on mask-1 tokens), ``logprobs`` the sampling log-probs (0 elsewhere).
  A non-contiguous or untrainable rollout arrives with an all-zero mask. A rollout that failed or
  missed the step deadline gets a one-token placeholder and a ``None`` reward, which TRL treats as
  unscorable (left out of its group's baseline, advantage 0).
- **Gradient share**: quotas are exact in prompts, but TRL's token-averaged loss gives each
  environment a share of the gradient proportional to its trained tokens (reported per step as
  ``trained_token_share``). ``gradient_share="plan"`` scales each environment's loss mask (TRL's
  ``env_mask`` becomes a per-token weight) so that its share of the step's loss weight equals its
  planned share of the prompts (``advantages.plan_token_weights``); the step's total weight stays
  its token count. It needs a loss that sums over tokens (``loss_type`` dapo, bnpo, dr_grpo, cispo,
  luspo): "grpo"/"sapo" average each sequence first, which cancels a per-sequence weight.
- **Dynamic sampling** (``TokenCollector(dynamic_sampling=...)``) may replace a planned group by
  a group of another prompt of the same environment; ``StepReport.slots`` says which slot each
  trained group fills, and ``batch`` lays the groups out by slot, so TRL's per-prompt grouping and
  each environment's quota are unchanged.
- **Rewards** come from the environments' verifiers: ``polygym_reward`` (the reward function to
  give TRL) returns them; TRL computes the group-relative advantages itself.
- **Weights and versions** (``weight_sync``, ``policy_version``): a weight-sync hook runs once
  before each step's rollouts are generated, with the step's number as the policy version (step
  ``n`` is trained by version ``n``); every rollout carries the version that generated it and
  the collector bounds how stale a trained rollout may be (``max_staleness``).
- **One-step off-policy** (``off_policy=OffPolicy()``): step ``n + 1`` is collected while step ``n``
  trains, with a truncated importance-sampling correction of the lag folded into ``env_mask``
  (``off_policy``); it needs a hook whose generator changes only at sync (``SnapshotWeights``, or
  TRL's vLLM server mode with ``TRLServerWeights``).
- **Metrics**: every step's per-environment values (``polygym/<env>/reward``, ``.../tokens``,
  ``.../truncated_share``, ``.../zero_variance_share``, ``.../masked_share``, ``.../validation_reward``
  ..., see ``env_metrics``) go into the trainer's log records next to TRL's own, hence to every
  ``report_to`` backend; ``on_step`` receives the full ``TokenStep`` (``gym train run`` writes it to
  JSONL).

The policy the environments see must be the model being trained: serve it with
``generation_server.GenerationServerThread`` and point the stack's ``vllm_model`` at it (what
``gym train run`` does), or use a remote generation server that receives the trainer's weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from polygym.blend.dynamic_sampling import task_stride
from polygym.items import item_text
from polygym.protocol import input_items
from polygym.training.advantages import plan_token_weights
from polygym.training.collector import TokenCollector, TokenStep
from polygym.training.env_metrics import step_metrics
from polygym.training.off_policy import OffPolicy, OneStepAhead, apply_is_correction, drain_callback
from polygym.training.tokens import TokenRollout
from polygym.training.weight_sync import WeightSync

REWARD_FIELD = "polygym_reward"
ENV_COLUMN = "polygym_env"
TASK_COLUMN = "polygym_task"
GradientShare = Literal["tokens", "plan"]
GRADIENT_SHARES: tuple[GradientShare, ...] = ("tokens", "plan")
_PER_SEQUENCE_LOSSES = frozenset({"grpo", "sapo"})


def prompt_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """A row's input as plain ``{role, content}`` messages (TRL's conversational prompt column)."""
    params = row.get("responses_create_params") or {}
    messages = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": str(params["instructions"])})
    for item in input_items(params):
        role = item.get("role")
        if item.get("type", "message") == "message" and isinstance(role, str):
            messages.append({"role": "system" if role == "developer" else role, "content": item_text(item)})
    return messages


def polygym_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the verifier's reward of each rollout (None for a missing rollout)."""
    rewards = kwargs.get(REWARD_FIELD)
    if rewards is None:
        raise ValueError(f"no {REWARD_FIELD} in the batch: use PolygymGRPO.rollout_func as rollout_func")
    return [None if r is None or (isinstance(r, float) and math.isnan(r)) else float(r) for r in rewards]


def weighted_mask(mask: list[int], weight: float) -> list[float]:
    """One ``env_mask`` row: the loss mask times the environment's weight, always as floats.

    Why floats even at weight 1: TRL turns each row into a tensor and pads them into one tensor of
    the *first* row's dtype, so a single integer row first in the batch (a failed or late slot's
    placeholder, an environment with no trained tokens) truncated every other row's fractional
    weight to a whole number (planned 0.5 / 0.5, applied 1.0 / 0.0). With every row float, the loss
    applies the weights as planned whatever comes first.
    """
    return [float(m) * weight for m in mask]


class PolygymGRPO:
    """Wires a ``TokenCollector`` (a blend + a stack serving the policy) to ``GRPOTrainer``."""

    def __init__(
        self,
        collector: TokenCollector,
        steps: int,
        start_step: int = 0,
        on_step: Callable[[TokenStep], None] | None = None,
        metrics_prefix: str = "polygym",
        gradient_share: GradientShare = "tokens",
        weight_sync: WeightSync | None = None,
        off_policy: OffPolicy | None = None,
    ) -> None:
        if gradient_share not in GRADIENT_SHARES:
            raise ValueError(
                f"gradient_share must be one of {', '.join(GRADIENT_SHARES)}, not {gradient_share!r}"
            )
        bound = collector.staleness.max_staleness
        if off_policy is not None and (weight_sync is None or not weight_sync.isolated):
            raise ValueError(
                "the off-policy mode needs a weight_sync whose generator changes only at sync "
                "(SnapshotWeights or TRLServerWeights): the shared model changes under the collection"
            )
        if off_policy is not None and bound is not None and bound < 1:
            raise ValueError(
                f"the off-policy mode trains 1-step-stale rollouts: max_staleness {bound} refuses them"
            )
        self.weight_sync = weight_sync
        self.off_policy = off_policy
        self.ahead = OneStepAhead(collector, off_policy.on_event) if off_policy is not None else None
        self.collector = collector
        self.gradient_share = gradient_share
        self.steps = steps
        self.start_step = start_step
        self.on_step = on_step
        self.metrics_prefix = metrics_prefix
        self.plan = collector.blend.plan()
        self.sampler = collector.blend.sampler(self.plan)
        self.next_step = start_step
        """The step the next generation batch collects (a resumed run sets it to its checkpoint's)."""
        self.history: list[TokenStep] = []
        self._pending: dict[str, float] = {}

    @property
    def prompts_per_step(self) -> int:
        return self.plan.prompts_per_step

    @property
    def responses_per_prompt(self) -> int:
        return self.plan.responses_per_prompt

    @property
    def temperature(self) -> float:
        """The temperature the policy samples at: TRL must compute training log-probs at it too.

        TRL divides the logits by ``GRPOConfig.temperature`` before its log-softmax; if that differs
        from the sampling temperature, the importance ratio and the loss are taken under a different
        distribution from the one that produced the tokens, silently.
        """
        value = (self.collector.sampling or {}).get("temperature")
        return 1.0 if value is None else float(value)

    # -- what TRL reads ------------------------------------------------------------------------------
    def train_dataset(self) -> Any:
        """The prompts of the steps to train, in step order (a ``datasets.Dataset``)."""
        from datasets import Dataset

        rows: dict[str, list[Any]] = {"prompt": [], ENV_COLUMN: [], TASK_COLUMN: []}
        stride = task_stride(self.plan, self.collector.dynamic_sampling)
        for step in self.sampler.steps(self.start_step, self.steps):
            for i, item in enumerate(step.items):
                rows["prompt"].append(prompt_messages(item.row))
                rows[ENV_COLUMN].append(item.env)
                rows[TASK_COLUMN].append(step.number * stride + i)
        return Dataset.from_dict(rows)

    def grpo_config(self, output_dir: str | Path, **overrides: Any) -> Any:
        """A ``GRPOConfig`` that makes one generation batch = one polygym step (overrides win)."""
        import torch
        from trl import GRPOConfig

        batch = self.prompts_per_step * self.responses_per_prompt
        settings: dict[str, Any] = {
            "output_dir": str(output_dir),
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": 1,
            "generation_batch_size": batch,
            "num_generations": self.responses_per_prompt,
            "num_iterations": 1,
            "temperature": self.temperature,
            "shuffle_dataset": False,
            "max_steps": self.steps,
            "beta": 0.0,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": not torch.cuda.is_available(),
            "bf16": False,
            "dataloader_num_workers": 0,
            "seed": self.collector.blend.spec.seed,
            "disable_tqdm": True,
            # TRL turns it on by default; a small model has the memory, and recomputing the
            # forward pass costs a third more time per step
            "gradient_checkpointing": False,
        }
        settings.update(overrides)
        return GRPOConfig(**settings)

    def trainer(
        self,
        model: Any,
        tokenizer: Any,
        args: Any,
        extra_reward_funcs: list[Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """A ``GRPOTrainer`` on this blend (``kwargs`` go to the trainer: callbacks, optimizers...).

        The environments' rewards always come first; ``extra_reward_funcs`` (TRL reward functions,
        e.g. a length penalty) are added to them, weighted by ``args.reward_weights`` if set. With
        dynamic sampling on, TRL still passes them the *planned* prompt of each slot, not the
        replacement's (the completions are the real ones): a function that reads the prompt would
        score a replaced group against the wrong one.
        """
        import os

        from trl import GRPOTrainer

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        self._check_args(args)
        if self.ahead is not None:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), drain_callback(self.ahead)]
        return GRPOTrainer(
            model=model,
            reward_funcs=[polygym_reward, *(extra_reward_funcs or [])],
            args=args,
            train_dataset=self.train_dataset(),
            processing_class=tokenizer,
            rollout_func=self.rollout_func,
            **kwargs,
        )

    def _check_args(self, args: Any) -> None:
        batch = self.prompts_per_step * self.responses_per_prompt
        problems = []
        if args.generation_batch_size != batch:
            problems.append(
                f"generation_batch_size must be {batch} (one step), not {args.generation_batch_size}"
            )
        if args.num_generations != self.responses_per_prompt:
            problems.append(f"num_generations must be responses_per_prompt ({self.responses_per_prompt})")
        if args.shuffle_dataset:
            problems.append("shuffle_dataset must be False (the blend's sampler orders the prompts)")
        trained = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        if trained != batch:
            # TRL would split one generation batch over several optimizer steps, every step after
            # the first trained on completions the policy no longer produces (off-policy, unwarned)
            problems.append(
                f"per_device_train_batch_size x gradient_accumulation_steps x world_size must be {batch} "
                f"(one step per optimizer step), not {args.per_device_train_batch_size} x "
                f"{args.gradient_accumulation_steps} x {args.world_size} = {trained}"
            )
        if not math.isclose(args.temperature, self.temperature):
            problems.append(
                f"temperature must be the sampling temperature {self.temperature} (TRL computes the "
                f"training log-probs at it), not {args.temperature}"
            )
        if self.gradient_share == "plan" and getattr(args, "loss_type", "dapo") in _PER_SEQUENCE_LOSSES:
            problems.append(
                f"gradient_share='plan' needs a token-summed loss_type (dapo, bnpo, dr_grpo, cispo, luspo), "
                f"not {args.loss_type!r}: it averages each sequence, cancelling the weights"
            )
        if (
            self.off_policy is not None
            and self.off_policy.is_cap is not None
            and getattr(args, "use_vllm", False)
            and getattr(args, "vllm_importance_sampling_correction", False)
        ):
            problems.append(
                "vllm_importance_sampling_correction must be False with the off-policy mode's own "
                "correction (the same ratio would be applied twice; weight_sync.trl_server_settings)"
            )
        if getattr(args, "num_iterations", 1) != 1:
            problems.append("num_iterations must be 1 (each generation batch is a fresh polygym step)")
        if problems:
            raise ValueError("GRPOConfig does not match the blend: " + "; ".join(problems))

    # -- the rollout hook ----------------------------------------------------------------------------
    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: collect the next polygym step and return it token by token."""
        number = self.next_step
        expected = self._expected_prompts(number)
        if len(prompts) != len(expected) or any(p != e for p, e in zip(prompts, expected, strict=False)):
            raise RuntimeError(
                f"TRL asked for {len(prompts)} prompts that are not step {number} of the blend "
                f"({len(expected)} prompts); build the trainer with PolygymGRPO.trainer and grpo_config"
            )
        step = self._collect(number, trainer)
        self.next_step = number + 1
        self.history.append(step)
        self.weigh(step)
        pad = trainer.processing_class.pad_token_id if hasattr(trainer, "processing_class") else 0
        outputs = self.batch(step, pad_id=pad if pad is not None else 0)
        if self.off_policy is not None and self.off_policy.is_cap is not None:
            apply_is_correction(outputs, step, trainer.model, self.temperature, self.off_policy.is_cap)
        if self.on_step is not None:
            self.on_step(step)  # may validate: its values join this step's record
        metrics = getattr(trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:
            values = {**step_metrics(step, self.metrics_prefix), **self._pending}
            self._pending.clear()
            for key, value in values.items():
                metrics["train"][key].append(value)
        return outputs

    def _collect(self, number: int, trainer: Any) -> TokenStep:
        """Sync the weights that train step ``number`` (policy version ``number``: step ``n`` is trained
        by version ``n``, so a resumed or offset run keeps the blend's step numbers), then take the
        step: collected now, or (off-policy) the one collected in the background, starting the next."""
        if self.ahead is not None:
            self.ahead.drain()  # never push weights under a collection in flight
        if self.weight_sync is not None:
            self.weight_sync.sync(trainer, number)
        if self.ahead is None:
            return self.collector.step(number)
        step = self.ahead.take(number)
        if number + 1 < self.start_step + self.steps:
            self.ahead.prefetch(number + 1)
        return step

    def log_metrics(self, values: dict[str, float]) -> None:
        """Queue values (``env_metrics.validation_metrics``...) for the trainer's next log record."""
        self._pending.update(values)

    def _expected_prompts(self, number: int) -> list[list[dict[str, str]]]:
        step = self.sampler.step(number)
        return [prompt_messages(item.row) for item in step.items for _ in range(self.responses_per_prompt)]

    def weigh(self, step: TokenStep) -> None:
        """Set the step's per-environment loss weights (all 1.0 unless ``gradient_share="plan"``)."""
        if self.gradient_share != "plan":
            return
        envs = {env: s for env, s in step.stats.items() if env in self.plan.quotas}
        step.set_loss_weights(
            plan_token_weights(
                {env: s.generated_tokens for env, s in envs.items()},
                {env: s.planned_share for env, s in envs.items()},
            )
        )

    def batch(self, step: TokenStep, pad_id: int = 0) -> dict[str, list[Any]]:
        """``rollout_func`` output for a collected step, in TRL's order (prompt-major, R each)."""
        # a group's slot: the planned prompt it stands for (dynamic sampling may have replaced it)
        by_key = {(step.report.slots[r.group_id], r.rollout_index): r for r in step.rollouts}
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            REWARD_FIELD: [],
            ENV_COLUMN: [],
        }
        envs = [item.env for item in self.sampler.step(step.step).items]
        for i in range(self.prompts_per_step):
            for j in range(self.responses_per_prompt):
                rollout = by_key.get((i, j))
                if rollout is None or not rollout.completion_ids:
                    self._placeholder(out, pad_id, envs[i], rollout)
                    continue
                stats = step.stats.get(rollout.env)
                self._append(out, rollout, stats.loss_weight if stats is not None else 1.0)
        return out

    @staticmethod
    def _append(out: dict[str, list[Any]], rollout: TokenRollout, weight: float = 1.0) -> None:
        out["prompt_ids"].append(rollout.input_ids[: rollout.prompt_length])
        out["completion_ids"].append(rollout.completion_ids)
        out["logprobs"].append(rollout.completion_logprobs)
        out["env_mask"].append(weighted_mask(rollout.completion_mask, weight))
        out[REWARD_FIELD].append(rollout.reward)
        out[ENV_COLUMN].append(rollout.env)

    @staticmethod
    def _placeholder(out: dict[str, list[Any]], pad_id: int, env: str, rollout: TokenRollout | None) -> None:
        """A rollout that failed or has nothing trainable: one masked token, no reward."""
        prompt = rollout.input_ids[: rollout.prompt_length] if rollout and rollout.prompt_length else [pad_id]
        out["prompt_ids"].append(prompt)
        out["completion_ids"].append([pad_id])
        out["logprobs"].append([0.0])
        out["env_mask"].append(weighted_mask([0], 1.0))
        out[REWARD_FIELD].append(None if rollout is None else rollout.reward)
        out[ENV_COLUMN].append(env)
