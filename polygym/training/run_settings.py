"""The settings of ``gym train run``, each declared once: its default, its flag and its help text
(``polygym.settings``); ``polygym.cli.train`` generates the command's options from them, and
``run.json`` records them (``to_dict``), the record a ``--resume`` is checked against.

Fields are in the order ``--help`` lists them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from polygym.settings import cli
from polygym.training.off_policy import DEFAULT_IS_CAP
from polygym.training.policy_serving import RETEMPLATED_MASKED_SHARE
from polygym.training.policy_version import OnStale
from polygym.training.trl_adapter import GradientShare

OnAlarm = Literal["warn", "stop"]
"""What a run does when an alarm fires: report it, or also end training after the current step."""

POLICY_FIELDS = (
    "spec_path",
    "overrides",
    "output_dir",
    "model",
    "learning_rate",
    "temperature",
    "max_output_tokens",
    "validation_limit",
    "configs",
    "concurrency",
    "threads",
    "train_layers",
)
"""The spec, stack, policy and sampling settings of every command that trains (``gym train run``,
``gym train compare-mixes``)."""


@dataclass
class RunSettings:
    spec_path: Path = field(metadata=cli("", argument=True, metavar="SPEC"))
    output_dir: Path = field(metadata=cli("Folder for every file.", "--output", "-o", required=True))
    overrides: tuple[str, ...] = field(default=(), metadata=cli("", argument=True, metavar="[KEY=VALUE]..."))
    model: str = field(default="smollm2-135m", metadata=cli("Known model name, GGUF file or HF folder."))
    learning_rate: float = field(
        default=1e-4, metadata=cli("Constant learning rate.", "--learning-rate", "--lr")
    )
    temperature: float = field(default=1.0, metadata=cli("Sampling temperature."))
    max_output_tokens: int | None = field(default=None, metadata=cli("Default: each row's own.", min=1))
    validation_limit: int | None = field(default=None, metadata=cli("Validation rows per env.", min=1))
    configs: tuple[str, ...] = field(
        default=(), metadata=cli("Extra config file merged into the stack (repeatable).", "--config")
    )
    concurrency: int = field(
        default=64,
        metadata=cli("Rollouts in flight at once, shared out between the environments of a step.", min=1),
    )
    threads: int | None = field(default=None, metadata=cli("Torch threads (default: all cores).", min=1))
    train_layers: int | None = field(default=None, metadata=cli("Train only the top N blocks.", min=1))
    steps: int = field(default=24, metadata=cli("Optimizer steps.", min=1))
    step_timeout_s: float | None = field(
        default=None, metadata=cli("Seconds per step before stragglers are cut.", "--step-timeout")
    )
    save_model: bool = field(default=False, metadata=cli("Save the trained weights to OUTPUT/model."))
    gradient_share: GradientShare = field(
        default="tokens",
        metadata=cli(
            "How the loss splits between environments. tokens: every trained token weighs 1, so an "
            "environment with longer episodes takes more of the gradient than of the prompts. plan: scale "
            "each environment's per-token loss weight so its share of the gradient equals its planned "
            "share. train_log.jsonl reports trained_token_share and gradient_share per environment and step."
        ),
    )
    validate_every: int | None = field(
        default=None,
        metadata=cli(
            "Also validate every N steps (greedy, the same rows each time), besides before and after; "
            "every validation adds a line per environment (eval_only ones included) to "
            "OUTPUT/validation.jsonl.",
            min=1,
        ),
    )
    seed: int | None = field(
        default=None,
        metadata=cli(
            "Seed of the trainer (TRL and torch: sampling, dropout, any initialization), separate from the "
            "blend spec's seed, which alone decides the prompts of every step. Default: the spec's seed."
        ),
    )
    max_regression: dict[str, float] = field(
        default_factory=dict,
        metadata=cli(
            "Warn when ENV's mean validation reward fell more than DELTA since step 0 and the 95% "
            "paired-bootstrap interval of the drop (over the same prompts) excludes 0, at any validation "
            "(--validate-every) and at the end; a validation with no scored rollout of ENV also warns. The "
            "warning shows the drop and its interval (repeatable; summary.json lists them; rule in "
            "docs/multi_env_batches.md).",
            multiple=True,
            metavar="ENV=DELTA",
        ),
    )
    on_regression: OnAlarm = field(
        default="warn", metadata=cli("stop: also end training after the step whose validation regressed.")
    )
    max_masked_share: float | None = field(
        default=None,
        metadata=cli(
            "Alarm when more than SHARE of an environment's rollouts in a step are masked (trained on "
            "nothing: history drift the model server could not avoid, missing token ids): a warning, "
            "masked_alarm in train_log.jsonl and the trainer's metrics. Every step reports masked_share.",
            min=0,
            max=1,
            metavar="SHARE",
        ),
    )
    on_masked: OnAlarm = field(
        default="warn",
        metadata=cli("stop: also end training after the step whose masked share passed --max-masked-share."),
    )
    max_staleness: int | None = field(
        default=None,
        metadata=cli(
            "The most optimizer steps a trained rollout may lag the policy that trains on it (every "
            "rollout is stamped with the policy version that generated it). Default: no bound, 1 with "
            "--off-policy. train_log.jsonl records each step's versions and staleness.",
            min=0,
        ),
    )
    on_stale: OnStale = field(
        default="refuse",
        metadata=cli(
            "refuse: mask rollouts staler than --max-staleness (no gradient; reward still reported); "
            "report: train on them and count them."
        ),
    )
    off_policy: bool = field(
        default=False,
        metadata=cli(
            "One-step off-policy: collect step N+1 while step N trains (the generator serves a copy of "
            "the weights, synced before each step), with a truncated importance-sampling correction from "
            "the recorded generation log-probs; each step's IS ratios go to train_log.jsonl."
        ),
    )
    is_cap: float = field(
        default=DEFAULT_IS_CAP, metadata=cli("Truncation of the --off-policy importance ratio.", min=1.0)
    )
    vllm_server: str | None = field(
        default=None,
        metadata=cli(
            "Generate with a vLLM server (http://host:8000) fed the trainer's weights by TRL's server "
            "mode (use_vllm=True) before each step, instead of the in-process generation server. Needs a "
            "CUDA trainer and vllm installed; recipe in examples/train_grpo_vllm/. Multi-turn prompts "
            "after the first are then rendered from the history's text (counted as retemplated_turns; a "
            f"drifted rollout is masked; masked-share alarm at {RETEMPLATED_MASKED_SHARE:.0%} unless "
            "--max-masked-share says otherwise).",
            metavar="URL",
        ),
    )
    vllm_prefix_token_ids: bool = field(
        default=False,
        metadata=cli(
            "The --vllm-server implements NeMo Gym's required_prefix_token_ids extension (NeMo RL's vLLM "
            "server does; stock vllm serve and trl vllm-serve do not): multi-turn prompts then extend the "
            "exact ids generated instead of re-rendering the history. A server without it fails drifted "
            "turns (502)."
        ),
    )
    allow_starved: tuple[str, ...] = field(
        default=(),
        metadata=cli(
            "Train although the plan gives ENV 0 prompts in every step (it is still validated). Without "
            "it such a plan exits 2; every warning of the plan (gym train plan) is shown before step 0 "
            "(repeatable).",
            metavar="ENV",
        ),
    )
    dynamic_sampling: int | None = field(
        default=None,
        metadata=cli(
            "Replace prompt groups whose rewards all agree (no GRPO signal) with groups of extra prompts "
            "from the same environment, so every environment keeps its exact quota; each environment "
            "draws at most MAX_EXTRA extra prompts per step, and slots still without signal are counted "
            "as unfilled. train_log.jsonl's dynamic_sampling field says, per environment and step, what "
            "was drawn, seen and dropped. Default: off.",
            min=1,
            metavar="MAX_EXTRA",
        ),
    )
    checkpoint_every: int | None = field(
        default=None,
        metadata=cli(
            "Save a checkpoint (weights, optimizer, RNG states, trainer state) to OUTPUT/trainer every N "
            "steps, keeping the last two (each up to about 3x the float32 model: weights and Adam state). "
            "Default: none.",
            min=1,
            metavar="N",
        ),
    )
    resume: bool = field(
        default=False,
        metadata=cli(
            "Continue the run in OUTPUT from its last checkpoint: the same settings are required, steps "
            "after the checkpoint are collected again with the same prompts and quotas, and every file "
            "holds each step exactly once."
        ),
    )
    report_to: tuple[str, ...] = field(
        default=(),
        metadata=cli(
            "Send every log record (TRL's and polygym/<env>/... per environment: reward, tokens, "
            "truncated_share, zero_variance_share, masked_share, validation_reward) to a transformers "
            "integration: tensorboard, wandb, mlflow... (repeatable; the backend's package must be "
            "installed). Default: none (trainer_log.jsonl holds the same records).",
            metavar="BACKEND",
        ),
    )
    trainer_overrides: dict[str, Any] = field(default_factory=dict)
    """``GRPOConfig`` values laid over the run's own, for a caller of ``train_run`` (no option)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["spec_path"] = str(self.spec_path)
        data["output_dir"] = str(self.output_dir)
        return data
