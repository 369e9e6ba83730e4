"""What a training run reports: its progress lines, curves, comparison and the totals of its summary.

Everything here reads the run's own files (``train_log.jsonl``, ``validation.jsonl``, the validation
rollouts) or one collected step, so a resumed run reports every step, those before the resume too.
``save_progress`` rewrites ``trainer_log.jsonl`` and ``curves.png`` at every validation and at the
end: a run stopped between validations keeps them up to its last one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polygym.collect.compare import CompareError, Comparison, compare
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.row import ALL_ENVS
from polygym.training.collector import TokenStep
from polygym.training.off_policy import describe
from polygym.training.validation import validation_file, validation_means


def step_line(step: TokenStep) -> str:
    """The progress line of a trained step: reward and realized share, trained-token (and, when
    weighted, gradient) share per environment, collection time, masked rollouts, off-policy and
    dynamic-sampling notes."""
    parts = [
        f"{env} {s.reward_mean:.3f} ({s.realized_share:.0%})"
        for env, s in step.stats.items()
        if env != ALL_ENVS and s.reward_mean is not None
    ]
    masked = step.total.masked
    tokens = ", ".join(
        f"{env} {s.trained_token_share:.0%}"
        + (
            f" (gradient {s.gradient_share:.0%})"
            if s.loss_weight != 1.0 and s.gradient_share is not None
            else ""
        )
        for env, s in step.stats.items()
        if env != ALL_ENVS and s.trained_token_share is not None
    )
    return (
        f"step {step.step}: reward {'; '.join(parts)}; trained tokens {tokens}; "
        f"{step.report.elapsed_s:.1f}s collect"
        + (f"; {masked} masked" if masked else "")
        + describe(step)
        + _dynamic_note(step)
    )


def _dynamic_note(step: TokenStep) -> str:
    draws = step.report.dynamic
    if draws is None:
        return ""
    parts = [
        f"{env} +{d.extra_prompts} drawn, {d.zero_variance_dropped} dropped"
        + (f", {d.unfilled} unfilled (bound reached)" if d.unfilled else "")
        for env, d in draws.items()
        if d.extra_prompts or d.zero_variance_seen
    ]
    return f"; dynamic sampling: {', '.join(parts)}" if parts else ""


def rewards_line(rewards: dict[str, float]) -> str:
    """``env 0.125, env 0.500``: a validation's means in one line."""
    return ", ".join(f"{env} {value:.3f}" for env, value in rewards.items())


def run_totals(lines: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Rollout counts over the run, from the ``_all`` lines of ``train_log.jsonl``."""
    totals = [line for line in lines if line["env"] == ALL_ENVS]
    names = {
        "stale_rollouts": "stale",
        "masked_rollouts": "masked",
        "non_contiguous_rollouts": "non_contiguous",
        "retemplated_turns": "retemplated_turns",
        "failed_rollouts": "failures",
        "truncated_rollouts": "truncated",
        "truncated_turns": "truncated_turns",
    }
    return {key: sum(line[field] for line in totals) for key, field in names.items()}


def masked_shares(lines: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Each environment's share of masked rollouts over the run (and ``_all``), from
    ``train_log.jsonl``'s lines."""
    counts: dict[str, list[int]] = {}
    for line in lines:
        total = counts.setdefault(line["env"], [0, 0])
        total[0] += line["masked"]
        total[1] += line["rollouts"]
    return {env: masked / n if n else None for env, (masked, n) in counts.items()}


def token_shares(lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per environment over the whole run (``train_log.jsonl`` lines): planned share of the prompts,
    share of the trained tokens and share of the loss weight (what the gradient followed)."""
    by_env: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line["env"] != ALL_ENVS:
            by_env.setdefault(line["env"], []).append(line)
    trained = sum(line["generated_tokens"] for env_lines in by_env.values() for line in env_lines)
    weighted = sum(
        line["generated_tokens"] * line["loss_weight"] for env_lines in by_env.values() for line in env_lines
    )
    out: dict[str, dict[str, float | None]] = {}
    for env, env_lines in by_env.items():
        tokens = sum(line["generated_tokens"] for line in env_lines)
        weight = sum(line["generated_tokens"] * line["loss_weight"] for line in env_lines)
        out[env] = {
            "planned_share": env_lines[0]["planned_share"],
            "trained_tokens": tokens,
            "trained_token_share": tokens / trained if trained else None,
            "gradient_share": weight / weighted if weighted else None,
        }
    return out


def dynamic_totals(lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per environment (and ``_all``), dynamic sampling's draws summed over the run's steps."""
    out: dict[str, dict[str, int]] = {}
    for line in lines:
        totals = out.setdefault(line["env"], {})
        for key, value in (line.get("dynamic_sampling") or {}).items():
            totals[key] = totals.get(key, 0) + value
    return out


def final_comparison(out: Path, echo: Any) -> Comparison | None:
    """``gym eval compare`` of the first and last validations into ``comparison.json``; None (and a
    warning) when the last one scored nothing: its ``--max-regression`` alarm has said so already."""
    try:
        comparison = compare(validation_file(out, 0), validation_file(out, 0, final=True))
    except CompareError as exc:
        echo(f"warning: no comparison.json: {exc}")
        return None
    (out / "comparison.json").write_text(json.dumps(comparison.to_dict(), indent=2))
    return comparison


def save_progress(out: Path, log_history: list[dict[str, Any]], model: str) -> None:
    """``trainer_log.jsonl`` and ``curves.png`` as they stand: after every validation and at the
    end, so a run stopped between validations still has them up to the last one."""
    write_jsonl(log_history, out / "trainer_log.jsonl")
    curves = validation_means(list(iter_jsonl(out / "validation.jsonl")))
    plot_curves(out / "train_log.jsonl", out / "curves.png", curves, title=f"GRPO on {model}")


def _moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot_curves(
    log_path: Path,
    png: Path,
    validation: Mapping[int, Mapping[str, float]] | None = None,
    title: str = "GRPO",
    window: int = 5,
) -> None:
    """Reward per step for each environment (raw and moving average), every validation point
    (``validation``: ``{step: {env: mean reward}}``, as :func:`validation_means` reads
    ``validation.jsonl``; eval_only environments too), and each environment's realized share per
    step, from a ``train_log.jsonl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float | None, float]]] = {}
    for line in iter_jsonl(log_path) if log_path.exists() else ():
        if line.get("env") == ALL_ENVS:
            continue
        series.setdefault(line["env"], []).append(
            (line["step"], line.get("reward_mean"), line["realized_share"])
        )
    validated: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(validation or {}):
        for env, value in (validation or {})[step].items():
            if not math.isnan(value):
                validated.setdefault(env, []).append((step, value))
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, env in enumerate(dict.fromkeys([*series, *validated])):
        color = colors[i % len(colors)]
        points = series.get(env, [])
        steps = [p[0] for p in points if p[1] is not None]
        rewards = [float(p[1]) for p in points if p[1] is not None]
        if rewards:
            top.plot(steps, rewards, color=color, alpha=0.3, linewidth=1)
            top.plot(
                steps,
                _moving_average(rewards, window),
                color=color,
                linewidth=2,
                label=f"{env} (train, {window}-step mean)",
            )
        if env in validated:
            top.plot(
                [p[0] for p in validated[env]],
                [p[1] for p in validated[env]],
                color=color,
                linestyle="--",
                marker="o",
                label=f"{env} validation (greedy, after N updates)",
            )
        if points:
            bottom.plot([p[0] for p in points], [p[2] for p in points], color=color, marker=".", label=env)
    top.set_ylabel("reward")
    top.set_title(title)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="best")
    bottom.set_ylabel("realized share")
    bottom.set_xlabel("training step")
    bottom.set_ylim(0, 1)
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)
    plt.close(figure)
