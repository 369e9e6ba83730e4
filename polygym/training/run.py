"""``gym train run SPEC``: a complete GRPO run on a blend, on this machine, with before/after validation.

What one run does, in order (every file lands in ``--output DIR``):

1. Loads the policy (``models.load_policy``; default SmolLM2-135M-Instruct from a pip package) and
   serves the very model object being trained as a vLLM-like generation server
   (``generation_server``) on a loopback port.
2. Starts the blend's environments and agents in this process, with ``vllm_model`` pointed at that
   server and token capture on: every rollout is sampled from the current weights (on-policy), and
   multi-turn prompts extend the exact ids already generated (``supply_prefix_token_ids``,
   ``continuation``; with ``--vllm-server`` only given ``--vllm-prefix-token-ids``, see
   ``policy_serving``). ``--max-masked-share`` warns (``--on-masked stop``: stops) when a step masks
   more of an environment's rollouts than that.
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
   environment and step, plus ``_all``) and to the trainer's log records (``env_metrics``: also to
   any ``--report-to`` backend), which ``trainer_log.jsonl`` keeps with TRL's own (loss, KL, clip
   ratios...); every rollout to ``rollouts/train*.jsonl``. With ``--dynamic-sampling`` groups
   without reward variance are replaced from the same environment (``blend.dynamic_sampling``);
   with ``--checkpoint-every`` the trainer saves checkpoints that ``--resume`` continues from
   exactly (``checkpoint``).
5. Validates again (``validation_after*``), compares the two runs per environment with
   ``gym eval compare``'s logic (``comparison.json``), and draws ``curves.png``: reward per step for
   each environment (with a moving average), the before/after validation rewards, and the
   realized share of each environment per step.
6. Writes ``summary.json``: settings, phase timings, validation rewards and regressions (the
   settings are also written first, to ``run.json``: the record a resume is checked against).

Nothing is saved of the weights unless ``--save-model`` is given (a 135M model is 540 MB in float32).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polygym.blend.dynamic_sampling import DynamicSampling
from polygym.blend.mix import Blend, load_blend
from polygym.blend.planner import Plan
from polygym.blend.spec import BlendSpec, load_spec
from polygym.blend.stepwise import environments_to_serve
from polygym.collect.compare import CompareError, Comparison, compare
from polygym.collect.eval_run import run_eval
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFiles
from polygym.jsonl import append_jsonl, iter_jsonl, write_jsonl
from polygym.row import ALL_ENVS, Job, make_job, reward
from polygym.stack.catalog import selector_paths
from polygym.stack.config import StackConfig, load_config
from polygym.training.checkpoint import (
    TRAINER_DIR,
    check_resumable,
    checkpoint_config,
    keep_steps_before,
    marker_callback,
    start_fresh,
)
from polygym.training.collector import TokenCollector, TokenStep
from polygym.training.env_metrics import validation_metrics
from polygym.training.off_policy import DEFAULT_IS_CAP, OffPolicy, describe
from polygym.training.policy_version import OnStale, StalenessBound
from polygym.training.regression import Regression, judge_regression, task_rewards
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
    """Environment -> the largest drop of its mean validation reward vs step 0 tolerated (the rule:
    ``regression``)."""
    on_regression: str = "warn"
    """"warn": report a larger drop; "stop": also end training after the current step."""
    max_masked_share: float | None = None
    """Alarm when a step masks more than this share of an environment's rollouts."""
    on_masked: str = "warn"
    """"warn": report it; "stop": also end training after the current step."""
    gradient_share: GradientShare = "tokens"
    """"tokens": each trained token weighs 1 (an environment's gradient share follows its token
    count); "plan": each environment's gradient share is its planned share (``trl_adapter``)."""
    max_staleness: int | None = None
    """The most steps a trained rollout may lag the policy (``policy_version``); None: no bound
    (with ``off_policy``: 1)."""
    on_stale: OnStale = "refuse"
    """"refuse": mask rollouts over ``max_staleness`` (reward still reported); "report": train on them."""
    off_policy: bool = False
    """Collect step N+1 while step N trains, corrected by truncated importance sampling (``off_policy``)."""
    is_cap: float = DEFAULT_IS_CAP
    """Truncation of the off-policy importance ratio."""
    vllm_server: str | None = None
    """A vLLM server (``http://host:8000``) serving the policy, fed the trainer's weights by TRL's
    server mode (``use_vllm=True``); None: the in-process generation server."""
    vllm_prefix_token_ids: bool = False
    """``vllm_server`` implements ``required_prefix_token_ids`` (NeMo RL's vLLM server; stock
    ``vllm serve`` does not): multi-turn prompts then extend the exact ids (``policy_serving``)."""
    allow_starved: tuple[str, ...] = ()
    """Environments the run may starve (0 prompts in every step): any other starved one is refused."""
    dynamic_sampling: int | None = None
    """Extra prompts each environment may draw per step to replace groups without reward variance
    (``blend.dynamic_sampling``); None: off."""
    checkpoint_every: int | None = None
    """Save a checkpoint every N optimizer steps (``checkpoint``); None: never."""
    resume: bool = False
    """Continue the run in ``output_dir`` from its last checkpoint, exactly (``checkpoint``)."""
    report_to: tuple[str, ...] = ()
    """``report_to`` integrations of transformers (tensorboard, wandb...) for every log record."""
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
    spec: BlendSpec,
    generation_url: str,
    configs: Sequence[str],
    overrides: Sequence[str],
    supply_prefix_token_ids: bool = True,
) -> StackConfig:
    """The blend's environments + ``vllm_model`` in front of the generation server, with token
    capture on; ``supply_prefix_token_ids`` only for a server implementing that extension
    (``policy_serving``: a server without it would fail every drifted later turn with a 502)."""
    paths = selector_paths(environments_to_serve(spec), ["vllm_model"], list(configs))
    base = [
        f"policy_base_url={generation_url}",
        "policy_api_key=",
        f"policy_model_name={POLICY_NAME}",
        "policy_model.responses_api_models.vllm_model.return_token_ids=true",
        "policy_model.responses_api_models.vllm_model.supply_prefix_token_ids="
        + str(supply_prefix_token_ids).lower(),
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


class StarvedEnvironment(ValueError):
    """The plan gives an environment 0 prompts in every step and ``--allow-starved`` does not name it.

    Quotas are the same in every step, so such an environment is never trained, while it is
    validated like the others: a run would report its curve as if training had reached it.
    """


def check_plan(plan: Plan, allowed: Sequence[str], source: Path, echo: Any) -> None:
    """Show every warning of the run's plan; raise :class:`StarvedEnvironment` for a starved
    environment not in ``allowed``, and ValueError for an ``allowed`` name the plan does not train."""
    for warning in plan.warnings:
        echo(f"warning: plan: {warning}")
    trained = [env.name for env in plan.environments]
    unknown = [env for env in allowed if env not in trained]
    if unknown:
        raise ValueError(f"--allow-starved: no trained environment {', '.join(unknown)} in {source}")
    refused = [env for env in plan.starved if env not in allowed]
    if refused:
        names = ", ".join(refused)
        flags = " ".join(f"--allow-starved {env}" for env in refused)
        raise StarvedEnvironment(
            f"{source}: {names} would get 0 of the {plan.prompts_per_step} prompts in every step of the run "
            f"(never trained, still validated); raise prompts_per_step to {plan.suggested_prompts_per_step} "
            f"(gym train plan {source} shows why), or pass {flags} to train without "
            f"{'it' if len(refused) == 1 else 'them'}"
        )
    for env in allowed:
        if env not in plan.starved:
            echo(f"note: --allow-starved {env}: {env} is not starved ({plan.quotas[env]} prompts per step)")


class EnvironmentFailing(RuntimeError):
    """An environment none of whose step-0 validation rollouts could be scored.

    Training would go on for hours on nothing from it (its rollouts fail, TRL sees no reward) and
    its curve would be a line of NaN: seen on a machine where the environment's library missed a
    dependency. The message names each such environment and its first recorded failure.
    """


def require_scored(rewards: dict[str, list[float]], output: Path, blend: Blend) -> None:
    """Raise :class:`EnvironmentFailing` when an environment has no scored validation rollout."""
    dead = [env for env, values in rewards.items() if not values]
    if not dead:
        return
    agents = {env.agent: env.name for env in blend.environments}
    first: dict[str, str] = {}
    failures = RunFiles(output).failures
    for failure in iter_jsonl(failures) if failures.exists() else ():
        env = agents.get((failure.get("agent_ref") or {}).get("name", ""))
        if env in dead and env not in first:
            first[env] = f"{failure.get('error_class')}: {failure.get('error')}"
    found = (f"{env}: no validation rollout was scored ({first.get(env, 'none recorded')})" for env in dead)
    raise EnvironmentFailing("; ".join(found) + f"; stopped before training (failures in {failures})")


def mean_rewards(rewards: dict[str, list[float]]) -> dict[str, float]:
    return {env: statistics.fmean(values) if values else math.nan for env, values in rewards.items()}


def regressions(
    step: int, base: Path, now: Path, limits: dict[str, float], agents: dict[str, str]
) -> list[Regression]:
    """The ``--max-regression`` alarms of the validation at ``step``: one per environment of
    ``limits`` that :func:`regression.judge_regression` flags (``base``, ``now``: the step-0 and
    step-``step`` validations' rollout files; ``agents``: environment -> agent, the names they use)."""
    by_agent = {agent: env for env, agent in agents.items()}
    before, after = task_rewards(base, by_agent), task_rewards(now, by_agent)
    verdicts = (judge_regression(env, step, before[env], after[env], limit) for env, limit in limits.items())
    return [verdict for verdict in verdicts if verdict.alarm]


def validation_file(out: Path, step: int, final: bool = False) -> Path:
    """Where the validation after ``step`` updates is written (the one before any update, those
    every ``--validate-every`` steps, the one at the end)."""
    if final:
        return out / "validation_after.jsonl"
    return out / "validation_before.jsonl" if step == 0 else out / "validation" / f"step_{step}.jsonl"


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

    from polygym.training.models import load_policy, to_training_device, train_top_layers
    from polygym.training.policy_serving import masked_share_bound, serve_policy
    from polygym.training.trl_adapter import PolygymGRPO

    began = time.perf_counter()
    timings: dict[str, float] = {}
    out = settings.output_dir
    spec = load_spec(settings.spec_path)
    blend = load_blend(spec)
    plan = blend.plan()
    check_plan(plan, settings.allow_starved, settings.spec_path, echo)
    resume_from = check_resumable(out, settings.to_dict()) if settings.resume else None
    out.mkdir(parents=True, exist_ok=True)
    start = resume_from[1] if resume_from is not None else 0
    torch.set_num_threads(settings.threads or os.cpu_count() or 1)
    validation = load_blend(spec, split="validation")
    missing = [env.name for env in validation.environments if not validation.rows[env.name]]
    if missing:
        raise ValueError(f"{settings.spec_path}: no validation rows for {', '.join(missing)}")
    unknown = sorted(set(settings.max_regression) - {env.name for env in validation.environments})
    if unknown:
        raise ValueError(f"--max-regression: no environment {', '.join(unknown)} in {settings.spec_path}")

    t = time.perf_counter()
    model, tokenizer = policy if policy is not None else load_policy(settings.model)
    model = to_training_device(model)
    timings["load_model_s"] = time.perf_counter() - t
    total = sum(p.numel() for p in model.parameters())
    trainable = total if settings.train_layers is None else train_top_layers(model, settings.train_layers)
    echo(f"policy {settings.model}: {total / 1e6:.0f}M parameters, {trainable / 1e6:.0f}M trained")

    if resume_from is None:
        start_fresh(out, out / TRAINER_DIR, settings.to_dict())
    else:
        echo(f"resuming at step {start} from {resume_from[0]}")
    log_path = out / "train_log.jsonl"
    keep_steps_before(log_path, start)
    steps: list[TokenStep] = []

    curves_path = out / "validation.jsonl"
    validated = keep_steps_before(curves_path, start)
    before = {line["env"]: _mean(line) for line in validated if line["step"] == 0}
    agents = {env.name: env.agent for env in validation.environments}

    def step_regressions(step: int, final: bool = False) -> list[Regression]:
        base, now = validation_file(out, 0), validation_file(out, step, final)
        return regressions(step, base, now, settings.max_regression, agents) if now.exists() else []

    # a resumed run keeps the alarms of the validations it had already done
    regressed = [
        found for step in validation_means(validated) if step > 0 for found in step_regressions(step)
    ]

    def check_regressions(step: int, final: bool = False) -> bool:
        found = step_regressions(step, final)
        for r in found:
            echo(f"warning: {r.describe()}")
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
                validation_file(out, step.step),
                settings.validation_limit,
                settings.max_output_tokens,
            )
            append_jsonl(validation_lines(step.step, rewards, validation), curves_path)
            grpo.log_metrics(validation_metrics(mean_rewards(rewards)))
            took = time.perf_counter() - t
            echo(f"validation at step {step.step}: {_rewards(mean_rewards(rewards))} ({took:.0f}s)")
            if check_regressions(step.step) and settings.on_regression == "stop":
                trainer.control.should_training_stop = True  # after this step's update
                echo(f"stopping after step {step.step}: --on-regression stop")
            save_progress(out, trainer.state.log_history, settings.model)  # a killed run keeps them
        alarmed = [env for env, s in step.stats.items() if env != ALL_ENVS and s.masked_alarm]
        for env in alarmed:
            echo(
                f"warning: step {step.step}: {step.stats[env].masked_share:.0%} of {env}'s rollouts "
                f"masked (--max-masked-share {masked_bound})"
            )
        if alarmed and settings.on_masked == "stop":
            trainer.control.should_training_stop = True
            echo(f"stopping after step {step.step}: --on-masked stop")
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
            f"{step.report.elapsed_s:.1f}s collect"
            + (f"; {masked} masked" if masked else "")
            + describe(step)
            + _dynamic_note(step)
        )

    sampling: dict[str, Any] = {"temperature": settings.temperature}
    if settings.max_output_tokens is not None:
        sampling["max_output_tokens"] = settings.max_output_tokens
    bound = settings.max_staleness if settings.max_staleness is not None or not settings.off_policy else 1
    serving = serve_policy(
        model,
        tokenizer,
        POLICY_NAME,
        settings.off_policy,
        settings.vllm_server,
        settings.vllm_prefix_token_ids,
    )
    with serving as served:
        generator = served.generator
        config = stack_config(spec, served.url, settings.configs, settings.overrides, served.prefix_token_ids)
        masked_bound = masked_share_bound(settings.max_masked_share, served.prefix_token_ids)
        if not served.prefix_token_ids:
            echo(
                f"{settings.vllm_server}: no required_prefix_token_ids (--vllm-prefix-token-ids not "
                "given), so multi-turn prompts after the first are rendered from text: counted as "
                f"retemplated_turns, drifted rollouts masked; masked-share alarm at {masked_bound:.0%}"
            )
        collector = TokenCollector(
            blend,
            out / "rollouts" / "train.jsonl",
            stack_config=config,
            limits=Limits(concurrency=settings.concurrency),
            sampling=sampling,
            step_timeout_s=settings.step_timeout_s,
            overwrite=True,
            max_masked_share=masked_bound,
            staleness=StalenessBound(bound, settings.on_stale, served.weight_sync.published),
            dynamic_sampling=(
                DynamicSampling(settings.dynamic_sampling) if settings.dynamic_sampling is not None else None
            ),
        )
        with collector:
            grpo = PolygymGRPO(
                collector,
                settings.steps,
                on_step=on_step,
                gradient_share=settings.gradient_share,
                weight_sync=served.weight_sync,
                off_policy=OffPolicy(settings.is_cap) if settings.off_policy else None,
            )
            grpo.next_step = start  # the trainer skips the generation batches it trained already
            if resume_from is None:
                t = time.perf_counter()
                before_rewards = validate(
                    collector,
                    validation,
                    validation_file(out, 0),
                    settings.validation_limit,
                    settings.max_output_tokens,
                )
                require_scored(before_rewards, validation_file(out, 0), validation)
                append_jsonl(validation_lines(0, before_rewards, validation), curves_path)
                before = mean_rewards(before_rewards)
                grpo.log_metrics(validation_metrics(before))
                timings["validation_before_s"] = time.perf_counter() - t
                echo(f"validation before: {_rewards(before)} ({timings['validation_before_s']:.0f}s)")

            trainer_settings = {
                "learning_rate": settings.learning_rate,
                "lr_scheduler_type": "constant",
                "warmup_steps": 0,
                "weight_decay": 0.0,
                "max_grad_norm": 1.0,
                **({"seed": settings.seed} if settings.seed is not None else {}),
                **served.trainer_settings,
                **checkpoint_config(settings.checkpoint_every),
                "report_to": list(settings.report_to) or "none",
                **settings.trainer_overrides,
            }
            args = grpo.grpo_config(out / TRAINER_DIR, **trainer_settings)
            trainer = grpo.trainer(model, tokenizer, args, callbacks=[marker_callback()])
            t = time.perf_counter()
            trainer.train(resume_from_checkpoint=str(resume_from[0]) if resume_from is not None else None)
            timings["train_s"] = time.perf_counter() - t

            t = time.perf_counter()
            after_rewards = validate(
                collector,
                validation,
                validation_file(out, trainer.state.global_step, final=True),
                settings.validation_limit,
                settings.max_output_tokens,
            )
            append_jsonl(validation_lines(trainer.state.global_step, after_rewards, validation), curves_path)
            after = mean_rewards(after_rewards)
            check_regressions(trainer.state.global_step, final=True)
            if final := validation_metrics(after):
                trainer.log(final)  # the last record: through report_to too
            timings["validation_after_s"] = time.perf_counter() - t
            echo(f"validation after: {_rewards(after)} ({timings['validation_after_s']:.0f}s)")
    if settings.save_model:
        trainer.save_model(str(out / "model"))

    # the rollouts, not the metrics files: per-prompt rewards give intervals, not point deltas
    comparison = final_comparison(out, echo)
    save_progress(out, trainer.state.log_history, settings.model)
    lines = list(iter_jsonl(log_path))  # every step of the run, those before a resume too
    timings["total_s"] = time.perf_counter() - began
    summary = {
        "settings": settings.to_dict(),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "trainer_seed": args.seed,
        "blend_seed": spec.seed,
        "validation_before": before,
        "validation_after": after,
        "regressions": comparison.regressions if comparison is not None else None,
        "validation_regressions": [asdict(r) for r in regressed],
        "generation": {
            "batches": generator.stats.batches,
            "sequences": generator.stats.sequences,
            "generated_tokens": generator.stats.generated_tokens,
            "seconds": round(generator.stats.seconds, 1),
        }
        if generator is not None
        else {"vllm_server": settings.vllm_server},
        "staleness_bound": {"max_staleness": bound, "on_stale": settings.on_stale},
        **run_totals(lines),
        "prefix_token_ids": served.prefix_token_ids,
        "max_masked_share": masked_bound,
        "masked_share": masked_shares(lines),
        "masked_alarms": [
            {"step": line["step"], "env": line["env"]}
            for line in lines
            if line["env"] != ALL_ENVS and line.get("masked_alarm")
        ],
        "token_shares": token_shares(lines),
        "dynamic_sampling": dynamic_totals(lines) if settings.dynamic_sampling is not None else None,
        "resumed_at_step": start if resume_from is not None else None,
        "starved_environments": plan.starved,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(out, steps, comparison, timings, summary)


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


def save_progress(out: Path, log_history: list[dict[str, Any]], model: str) -> None:
    """``trainer_log.jsonl`` and ``curves.png`` as they stand: after every validation and at the
    end, so a run stopped between validations still has them up to the last one."""
    write_jsonl(log_history, out / "trainer_log.jsonl")
    curves = validation_means(list(iter_jsonl(out / "validation.jsonl")))
    plot_curves(out / "train_log.jsonl", out / "curves.png", curves, title=f"GRPO on {model}")


def validation_means(lines: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """``validation.jsonl`` lines as ``{step: {env: mean reward}}``."""
    out: dict[int, dict[str, float]] = {}
    for line in lines:
        out.setdefault(line["step"], {})[line["env"]] = _mean(line)
    return out


def _mean(line: dict[str, Any]) -> float:
    value = line.get("reward_mean")
    return float(value) if value is not None else math.nan


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
