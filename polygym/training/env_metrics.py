"""Per-environment values for a trainer's log records: one curve per environment in W&B or TensorBoard.

Every key is ``polygym/<env>/<name>`` (``all`` for the roll-up), so a dashboard groups them by
environment. Each training step's record carries:

- ``reward`` (mean verifier reward of the trained groups), ``tokens`` (assembled sequence tokens),
  ``generated_tokens``, ``truncated_share`` (rollouts cut at a token or turn limit),
  ``zero_variance_share`` (groups without GRPO signal in the trained batch), ``masked_share``
  (rollouts whose loss mask was zeroed, ``EnvTokenStats.masked_share``), ``realized_share``,
  ``trained_token_share``, ``gradient_share``;
- with dynamic sampling, ``dynamic/extra_prompts``, ``dynamic/zero_variance_seen``,
  ``dynamic/zero_variance_dropped`` and ``dynamic/unfilled``;
- every other numeric statistic of the step under its own name (``reward_mean``, ``failures``...);
- after a validation, ``validation_reward`` (eval_only environments included).

How they reach the backends: ``PolygymGRPO.rollout_func`` adds them to ``GRPOTrainer``'s metrics of
the step, which TRL passes with its own (loss, KL...) through ``Trainer.log`` to every ``report_to``
integration and to ``trainer.state.log_history``. A value queued with ``PolygymGRPO.log_metrics``
(a validation) goes into the next record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from polygym.row import ALL_ENVS
from polygym.training.collector import EnvTokenStats, TokenStep

PREFIX = "polygym"


def _name(env: str) -> str:
    return "all" if env == ALL_ENVS else env


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def curated(stats: EnvTokenStats) -> dict[str, float | None]:
    """The named per-environment values of the module doc, for one environment's step stats."""
    return {
        "reward": stats.reward_mean,
        "truncated_share": _share(stats.truncated, stats.completed),
    }


def step_metrics(step: TokenStep, prefix: str = PREFIX) -> dict[str, float]:
    """Every value of a training step's record (``None`` values left out: no data, no point)."""
    out = step.metrics(prefix)
    for env, stats in step.stats.items():
        values: dict[str, float | None] = dict(curated(stats))
        draws = step.report.env_extra(env).get("dynamic_sampling", {})
        values.update({f"dynamic/{k}": v for k, v in draws.items()})
        out.update({f"{prefix}/{_name(env)}/{k}": float(v) for k, v in values.items() if v is not None})
    return out


def validation_metrics(rewards: Mapping[str, float], prefix: str = PREFIX) -> dict[str, float]:
    """``polygym/<env>/validation_reward`` for each environment with a (finite) mean."""
    return {
        f"{prefix}/{env}/validation_reward": value for env, value in rewards.items() if math.isfinite(value)
    }
