"""``gym train run SPEC``: a complete GRPO run on a blend, on this machine, with before/after validation.

What one run does, in order (every file lands in ``--output DIR``):

1. Loads the policy (``models.load_policy``; default SmolLM2-135M-Instruct from a pip package) and
   serves the very model object being trained as a vLLM-like generation server
   (``generation_server``) on a loopback port.
2. Starts the blend's environments and agents in this process, with ``vllm_model`` pointed at that
   server and token capture on: every rollout is sampled from the current weights (on-policy).
3. Validates every environment on its validation rows (greedy, one response per row, the same rows
   each time: each environment's first ``--validation-limit``), written as a ``gym eval run``
   would: ``validation_before.jsonl`` and ``validation_before_aggregate_metrics.json``. ``eval_only``
   environments of the spec are validated too, never trained: they show what training on the
   others does to them. With ``--validate-every N`` this repeats every N steps
   (``validation/step_N.jsonl``); every validation adds one line per environment to
   ``validation.jsonl`` (step, env, eval_only, reward_mean, n): the validation curves.
4. Trains with TRL's ``GRPOTrainer`` through ``trl_adapter.PolygymGRPO``: each optimizer step is one
   step of the blend (exact per-environment quotas), collected through polygym's agents and
   verifiers. Each step's per-environment statistics go to ``train_log.jsonl`` (one line per
   environment and step, plus ``_all``) and to the trainer's logs; TRL's own log lines (loss, KL,
   clip ratios...) to ``trainer_log.jsonl``; every rollout to ``rollouts/train*.jsonl``.
5. Validates again (``validation_after*``), compares the two runs per environment with
   ``gym eval compare``'s logic (``comparison.json``), and draws ``curves.png``: reward per step for
   each environment (with a moving average), the before/after validation rewards, and the
   realized share of each environment per step.
6. Writes ``summary.json``: settings, phase timings, validation rewards and regressions.

Nothing is saved of the weights unless ``--save-model`` is given (a 135M model is 540 MB in float32).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polygym.blend.mix import Blend, load_blend
from polygym.blend.spec import BlendSpec, load_spec
from polygym.blend.stepwise import environments_to_serve
from polygym.collect.compare import Comparison, compare
from polygym.collect.eval_run import run_eval
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFiles
from polygym.jsonl import append_jsonl, iter_jsonl, write_jsonl
from polygym.row import ALL_ENVS, Job, make_job, reward
from polygym.stack.catalog import selector_paths
from polygym.stack.config import StackConfig, load_config
from polygym.training.collector import TokenCollector, TokenStep
from polygym.training.trl_adapter import GradientShare

POLICY_NAME = "policy"


@dataclass
class RunSettings:
    spec_path: Path
    output_dir: Path
    model: str = "smollm2-135m"
    steps: int = 24
    learning_rate: float = 1e-4
    temperature: float = 1.0
    max_output_tokens: int | None = None
    """Per request; None leaves each row's own ``max_output_tokens`` (else 256)."""
    validation_limit: int | None = None
    """Validation rows per environment (None: all)."""
    configs: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    concurrency: int = 64
    step_timeout_s: float | None = None
    threads: int | None = None
    train_layers: int | None = None
    """Train only the top N transformer blocks (None: every parameter)."""
    save_model: bool = False
    validate_every: int | None = None
    """Also validate every N optimizer steps (on top of before and after), into ``validation.jsonl``."""
    seed: int | None = None
    """The trainer's seed (TRL/torch: initialization, sampling of the served policy); None: the
    blend spec's seed. The blend's seed alone decides which prompts each step holds."""
    max_regression: dict[str, float] = field(default_factory=dict)
    """Environment -> the largest drop of its mean validation reward vs step 0 tolerated."""
    on_regression: str = "warn"
    """"warn": report a larger drop; "stop": also end training after the current step."""
    gradient_share: GradientShare = "tokens"
    """"tokens": each trained token weighs 1 (an environment's gradient share follows its token
    count); "plan": each environment's gradient share is its planned share (``trl_adapter``)."""
    trainer_overrides: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["spec_path"] = str(self.spec_path)
        data["output_dir"] = str(self.output_dir)
        return data


@dataclass
class RunResult:
    output_dir: Path
    steps: list[TokenStep]
    comparison: Comparison | None
    timings: dict[str, float]
    summary: dict[str, Any]


def stack_config(
    spec: BlendSpec, generation_url: str, configs: Sequence[str], overrides: Sequence[str]
) -> StackConfig:
    """The blend's environments + ``vllm_model`` in front of the generation server."""
    paths = selector_paths(environments_to_serve(spec), ["vllm_model"], list(configs))
    base = [
        f"policy_base_url={generation_url}",
        "policy_api_key=",
        f"policy_model_name={POLICY_NAME}",
        "policy_model.responses_api_models.vllm_model.return_token_ids=true",
    ]
    return load_config(paths, [*base, *overrides])


def validation_jobs(blend: Blend, limit: int | None, sampling: dict[str, Any]) -> list[Job]:
    """One greedy rollout per validation row of every environment (task indices run across them)."""
    jobs: list[Job] = []
    for env in blend.environments:
        rows = blend.stamped(env.name)
        for row in rows[:limit] if limit is not None else rows:
            jobs.append(make_job(row, env.agent, len(jobs), 0, sampling))
    return jobs


def validate(
    collector: TokenCollector, blend: Blend, output: Path, limit: int | None, max_tokens: int | None
) -> dict[str, list[float]]:
    """Collect the validation rollouts into ``output`` (a ``gym eval run`` file set); the rewards
    of each environment. The same rows every time (each environment's first ``limit``), greedy."""
    sampling: dict[str, Any] = {"temperature": 0.0}
    if max_tokens is not None:
        sampling["max_output_tokens"] = max_tokens
    jobs = validation_jobs(blend, limit, sampling)
    assert collector.client is not None
    files = RunFiles(output)
    collector.run(
        run_eval(collector.client, jobs, files, collector.limits, overwrite=True, progress_interval_s=60)
    )
    agents = {env.agent: env.name for env in blend.environments}
    rewards: dict[str, list[float]] = {env.name: [] for env in blend.environments}
    for rollout in iter_jsonl(files.output):
        env = agents.get((rollout.get("agent_ref") or {}).get("name", ""))
        if env is not None:
            rewards[env].append(reward(rollout))
    return rewards


def mean_rewards(rewards: dict[str, list[float]]) -> dict[str, float]:
    return {env: statistics.fmean(values) if values else math.nan for env, values in rewards.items()}


def regressions(
    step: int, before: dict[str, float], now: dict[str, float], limits: dict[str, float]
) -> list[dict[str, Any]]:
    """Environments whose mean validation reward fell by more than their limit since step 0."""
    found = []
    for env, limit in limits.items():
        drop = before.get(env, math.nan) - now.get(env, math.nan)
        if math.isfinite(drop) and drop > limit:
            found.append({"step": step, "env": env, "before": before[env], "now": now[env], "drop": drop})
    return found


def validation_lines(step: int, rewards: dict[str, list[float]], blend: Blend) -> list[dict[str, Any]]:
    """``validation.jsonl`` lines: one per environment (trained or eval_only) after ``step`` updates."""
    watched = {env.name for env in blend.environments if env.spec.eval_only}
    return [
        {
            "step": step,
            "env": env,
            "eval_only": env in watched,
            "reward_mean": statistics.fmean(values) if values else None,
            "n": len(values),
        }
        for env, values in rewards.items()
    ]


def train_run(settings: RunSettings, echo: Any = print, policy: tuple[Any, Any] | None = None) -> RunResult:
    """Run everything the module docstring lists; ``echo`` receives progress lines. ``policy``:
    a ``(model, tokenizer)`` already loaded (trained in place) instead of ``settings.model``'s."""
    import torch

    from polygym.training.generation_server import GenerationServerThread, HFGenerator
    from polygym.training.models import load_policy, train_top_layers
    from polygym.training.trl_adapter import PolygymGRPO

    began = time.perf_counter()
    timings: dict[str, float] = {}
    out = settings.output_dir
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(settings.threads or os.cpu_count() or 1)
    spec = load_spec(settings.spec_path)
    blend = load_blend(spec)
    validation = load_blend(spec, split="validation")
    missing = [env.name for env in validation.environments if not validation.rows[env.name]]
    if missing:
        raise ValueError(f"{settings.spec_path}: no validation rows for {', '.join(missing)}")
    unknown = sorted(set(settings.max_regression) - {env.name for env in validation.environments})
    if unknown:
        raise ValueError(f"--max-regression: no environment {', '.join(unknown)} in {settings.spec_path}")

    t = time.perf_counter()
    model, tokenizer = policy if policy is not None else load_policy(settings.model)
    timings["load_model_s"] = time.perf_counter() - t
    total = sum(p.numel() for p in model.parameters())
    trainable = total if settings.train_layers is None else train_top_layers(model, settings.train_layers)
    echo(f"policy {settings.model}: {total / 1e6:.0f}M parameters, {trainable / 1e6:.0f}M trained")

    log_path = out / "train_log.jsonl"
    log_path.write_text("")
    steps: list[TokenStep] = []

    curves_path = out / "validation.jsonl"
    curves_path.write_text("")
    regressed: list[dict[str, Any]] = []

    def check_regressions(step: int, now: dict[str, float]) -> bool:
        found = regressions(step, before, now, settings.max_regression)
        for r in found:
            echo(
                f"warning: {r['env']} validation reward fell {r['drop']:.3f} since step 0 "
                f"({r['before']:.3f} -> {r['now']:.3f}; --max-regression {settings.max_regression[r['env']]})"
            )
        regressed.extend(found)
        return bool(found)

    def on_step(step: TokenStep) -> None:
        every = settings.validate_every
        if every and step.step and step.step % every == 0:
            # rollout_func hands over step k before its update: the policy has had k updates
            t = time.perf_counter()
            rewards = validate(
                collector,
                validation,
                out / "validation" / f"step_{step.step}.jsonl",
                settings.validation_limit,
                settings.max_output_tokens,
            )
            append_jsonl(validation_lines(step.step, rewards, validation), curves_path)
            took = time.perf_counter() - t
            echo(f"validation at step {step.step}: {_rewards(mean_rewards(rewards))} ({took:.0f}s)")
            if check_regressions(step.step, mean_rewards(rewards)) and settings.on_regression == "stop":
                trainer.control.should_training_stop = True  # after this step's update
                echo(f"stopping after step {step.step}: --on-regression stop")
        steps.append(step)
        append_jsonl(step.log_lines(), log_path)
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
        echo(
            f"step {step.step}: reward {'; '.join(parts)}; trained tokens {tokens}; "
            f"{step.report.elapsed_s:.1f}s collect" + (f"; {masked} masked" if masked else "")
        )

    sampling: dict[str, Any] = {"temperature": settings.temperature}
    if settings.max_output_tokens is not None:
        sampling["max_output_tokens"] = settings.max_output_tokens
    generator = HFGenerator(model, tokenizer)
    with GenerationServerThread(generator, POLICY_NAME) as server:
        config = stack_config(spec, server.url, settings.configs, settings.overrides)
        collector = TokenCollector(
            blend,
            out / "rollouts" / "train.jsonl",
            stack_config=config,
            limits=Limits(concurrency=settings.concurrency),
            sampling=sampling,
            step_timeout_s=settings.step_timeout_s,
            overwrite=True,
        )
        with collector:
            t = time.perf_counter()
            before_rewards = validate(
                collector,
                validation,
                out / "validation_before.jsonl",
                settings.validation_limit,
                settings.max_output_tokens,
            )
            append_jsonl(validation_lines(0, before_rewards, validation), curves_path)
            before = mean_rewards(before_rewards)
            timings["validation_before_s"] = time.perf_counter() - t
            echo(f"validation before: {_rewards(before)} ({timings['validation_before_s']:.0f}s)")

            grpo = PolygymGRPO(
                collector,
                settings.steps,
                on_step=on_step,
                gradient_share=settings.gradient_share,
            )
            trainer_settings = {
                "learning_rate": settings.learning_rate,
                "lr_scheduler_type": "constant",
                "warmup_steps": 0,
                "weight_decay": 0.0,
                "max_grad_norm": 1.0,
                **({"seed": settings.seed} if settings.seed is not None else {}),
                **settings.trainer_overrides,
            }
            args = grpo.grpo_config(out / "trainer", **trainer_settings)
            trainer = grpo.trainer(model, tokenizer, args)
            t = time.perf_counter()
            trainer.train()
            timings["train_s"] = time.perf_counter() - t
            write_jsonl(trainer.state.log_history, out / "trainer_log.jsonl")

            t = time.perf_counter()
            after_rewards = validate(
                collector,
                validation,
                out / "validation_after.jsonl",
                settings.validation_limit,
                settings.max_output_tokens,
            )
            append_jsonl(validation_lines(trainer.state.global_step, after_rewards, validation), curves_path)
            after = mean_rewards(after_rewards)
            check_regressions(trainer.state.global_step, after)
            timings["validation_after_s"] = time.perf_counter() - t
            echo(f"validation after: {_rewards(after)} ({timings['validation_after_s']:.0f}s)")
    if settings.save_model:
        trainer.save_model(str(out / "model"))

    comparison = compare(
        out / "validation_before_aggregate_metrics.json", out / "validation_after_aggregate_metrics.json"
    )
    (out / "comparison.json").write_text(json.dumps(comparison.to_dict(), indent=2))
    plot_curves(log_path, out / "curves.png", before, after, title=f"GRPO on {settings.model}")
    timings["total_s"] = time.perf_counter() - began
    summary = {
        "settings": settings.to_dict(),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "trainer_seed": args.seed,
        "blend_seed": spec.seed,
        "validation_before": before,
        "validation_after": after,
        "regressions": comparison.regressions,
        "validation_regressions": regressed,
        "generation": {
            "batches": generator.stats.batches,
            "sequences": generator.stats.sequences,
            "generated_tokens": generator.stats.generated_tokens,
            "seconds": round(generator.stats.seconds, 1),
        },
        "masked_rollouts": sum(s.total.masked for s in steps),
        "non_contiguous_rollouts": sum(s.total.non_contiguous for s in steps),
        "failed_rollouts": sum(s.total.failures for s in steps),
        "truncated_rollouts": sum(s.total.truncated for s in steps),
        "truncated_turns": sum(s.total.truncated_turns for s in steps),
        "token_shares": token_shares(steps),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(out, steps, comparison, timings, summary)


def token_shares(steps: Sequence[TokenStep]) -> dict[str, dict[str, float | None]]:
    """Per environment over the whole run: planned share of the prompts, share of the trained
    tokens and share of the loss weight (what the gradient followed)."""
    envs = [env for env in (steps[0].stats if steps else {}) if env != ALL_ENVS]
    trained = sum(s.total.generated_tokens for s in steps)
    weighted = sum(s.stats[e].generated_tokens * s.stats[e].loss_weight for s in steps for e in envs)
    out: dict[str, dict[str, float | None]] = {}
    for env in envs:
        tokens = sum(s.stats[env].generated_tokens for s in steps)
        weight = sum(s.stats[env].generated_tokens * s.stats[env].loss_weight for s in steps)
        out[env] = {
            "planned_share": steps[0].stats[env].planned_share,
            "trained_tokens": tokens,
            "trained_token_share": tokens / trained if trained else None,
            "gradient_share": weight / weighted if weighted else None,
        }
    return out


def _rewards(rewards: dict[str, float]) -> str:
    return ", ".join(f"{env} {value:.3f}" for env, value in rewards.items())


def _moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot_curves(
    log_path: Path,
    png: Path,
    before: dict[str, float] | None = None,
    after: dict[str, float] | None = None,
    title: str = "GRPO",
    window: int = 5,
) -> None:
    """Reward per step for each environment (raw and moving average), validation before/after,
    and each environment's realized share per step, from a ``train_log.jsonl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float | None, float]]] = {}
    for line in iter_jsonl(log_path):
        if line.get("env") == ALL_ENVS:
            continue
        series.setdefault(line["env"], []).append(
            (line["step"], line.get("reward_mean"), line["realized_share"])
        )
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    last = max((p[0] for points in series.values() for p in points), default=0)
    for i, (env, points) in enumerate(series.items()):
        color = colors[i % len(colors)]
        steps = [p[0] for p in points if p[1] is not None]
        rewards = [float(p[1]) for p in points if p[1] is not None]
        top.plot(steps, rewards, color=color, alpha=0.3, linewidth=1)
        top.plot(
            steps,
            _moving_average(rewards, window),
            color=color,
            linewidth=2,
            label=f"{env} (train, {window}-step mean)",
        )
        if before and env in before and after and env in after:
            top.plot(
                [0, last],
                [before[env], after[env]],
                color=color,
                linestyle="--",
                marker="o",
                label=f"{env} validation before/after",
            )
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
