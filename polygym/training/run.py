"""``gym train run SPEC``: a complete GRPO run on a blend, on this machine, with before/after validation.

What one run does, in order (every file lands in ``--output DIR``; ``TrainingRun`` has one method
per phase):

0. Plans the steps (``blend.planner``): prints every warning of the plan and refuses, before the
   model is loaded, a plan that gives an environment 0 prompts in every step (``--allow-starved``).
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
   each environment (with a moving average), every validation's reward (before, each
   ``--validate-every``, after), and the realized share of each environment per step.
6. Writes ``summary.json``: settings, phase timings, validation rewards and regressions (the
   settings are also written first, to ``run.json``: the record a resume is checked against).

Nothing is saved of the weights unless ``--save-model`` is given (a 135M model is 540 MB in float32).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polygym.blend.dynamic_sampling import DynamicSampling
from polygym.blend.mix import Blend, load_blend
from polygym.blend.planner import Plan
from polygym.blend.spec import BlendSpec, load_spec
from polygym.blend.stepwise import environments_to_serve
from polygym.collect.compare import Comparison
from polygym.collect.regression import Regression
from polygym.collect.rollouts import Limits
from polygym.jsonl import append_jsonl, iter_jsonl
from polygym.row import ALL_ENVS
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
from polygym.training.off_policy import OffPolicy
from polygym.training.policy_version import StalenessBound
from polygym.training.run_report import (
    dynamic_totals,
    final_comparison,
    masked_shares,
    rewards_line,
    run_totals,
    save_progress,
    step_line,
    token_shares,
)
from polygym.training.run_settings import RunSettings
from polygym.training.validation import (
    line_mean,
    mean_rewards,
    regressions,
    require_scored,
    validate,
    validation_file,
    validation_lines,
    validation_means,
)

POLICY_NAME = "policy"


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


class TrainingRun:
    """One ``gym train run``, phase by phase, each a method a reader can find by its name:

    - ``plan``: the spec, its step plan (warnings shown, a starved environment refused), the
      validation rows, the resume point and the output folder: everything checked before the model;
    - ``load``: the policy, the layers trained, the run record or the resume;
    - ``validate``: one validation after ``step`` updates (files, curve lines, log metrics, the
      ``--max-regression`` alarms);
    - ``step``: what happens with every collected step (a validation every N, masked alarms, its log
      lines and progress line);
    - ``report``: the comparison, the curves and ``summary.json``.

    ``run`` calls them in order inside the policy's server and the collector (``serving``).
    """

    def __init__(
        self, settings: RunSettings, echo: Any = print, policy: tuple[Any, Any] | None = None
    ) -> None:
        self.settings = settings
        self.echo = echo
        self.policy = policy
        self.out = settings.output_dir
        self.began = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.steps: list[TokenStep] = []
        self.regressed: list[Regression] = []
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}

    @property
    def log_path(self) -> Path:
        return self.out / "train_log.jsonl"

    @property
    def curves_path(self) -> Path:
        return self.out / "validation.jsonl"

    def run(self) -> RunResult:
        """Every phase, in order; the files the module docstring lists."""
        import torch

        self.plan()
        torch.set_num_threads(self.settings.threads or os.cpu_count() or 1)
        self.load()
        with self.serving():
            if self.resume_from is None:
                self.before = self.validate(0)
            self.train()
            self.after = self.validate(self.trainer.state.global_step, final=True)
        if self.settings.save_model:
            self.trainer.save_model(str(self.out / "model"))
        return self.report()

    # -- plan ----------------------------------------------------------------------------------------
    def plan(self) -> None:
        """Read and check everything that needs no model: a bad setting stops the run here."""
        settings = self.settings
        self.spec: BlendSpec = load_spec(settings.spec_path)
        self.blend: Blend = load_blend(self.spec)
        self.step_plan: Plan = self.blend.plan()
        check_plan(self.step_plan, settings.allow_starved, settings.spec_path, self.echo)
        self.resume_from = check_resumable(self.out, settings.to_dict()) if settings.resume else None
        self.start = self.resume_from[1] if self.resume_from is not None else 0
        self.validation: Blend = load_blend(self.spec, split="validation")
        names = [env.name for env in self.validation.environments]
        missing = [name for name in names if not self.validation.rows[name]]
        if missing:
            raise ValueError(f"{settings.spec_path}: no validation rows for {', '.join(missing)}")
        unknown = sorted(set(settings.max_regression) - set(names))
        if unknown:
            raise ValueError(f"--max-regression: no environment {', '.join(unknown)} in {settings.spec_path}")
        self.out.mkdir(parents=True, exist_ok=True)

    # -- load ----------------------------------------------------------------------------------------
    def load(self) -> None:
        """The policy (trained in place), its trained layers, and the run's files: fresh, or cut back
        to the checkpoint a resume continues from (with the alarms of the validations kept)."""
        from polygym.training.models import load_policy, to_training_device, train_top_layers

        settings = self.settings
        t = time.perf_counter()
        model, self.tokenizer = self.policy if self.policy is not None else load_policy(settings.model)
        self.model = to_training_device(model)
        self.timings["load_model_s"] = time.perf_counter() - t
        total = sum(p.numel() for p in self.model.parameters())
        layers = settings.train_layers
        trainable = total if layers is None else train_top_layers(self.model, layers)
        self.echo(f"policy {settings.model}: {total / 1e6:.0f}M parameters, {trainable / 1e6:.0f}M trained")
        if self.resume_from is None:
            start_fresh(self.out, self.out / TRAINER_DIR, settings.to_dict())
        else:
            self.echo(f"resuming at step {self.start} from {self.resume_from[0]}")
        keep_steps_before(self.log_path, self.start)
        validated = keep_steps_before(self.curves_path, self.start)
        self.before = {line["env"]: line_mean(line) for line in validated if line["step"] == 0}
        for step in validation_means(validated):
            if step > 0:  # a resumed run keeps the alarms of the validations it had already done
                self.regressed.extend(self.regressions(step))

    # -- serving: the policy's server, the stack and the collector ----------------------------------
    @contextmanager
    def serving(self) -> Iterator[None]:
        """Serve the policy, start the blend's stack in front of it, and hold the collector and the
        TRL adapter for the phases inside."""
        from polygym.training.policy_serving import masked_share_bound, serve_policy
        from polygym.training.trl_adapter import PolygymGRPO

        settings = self.settings
        sampling: dict[str, Any] = {"temperature": settings.temperature}
        if settings.max_output_tokens is not None:
            sampling["max_output_tokens"] = settings.max_output_tokens
        off = settings.off_policy
        self.staleness_bound = settings.max_staleness if settings.max_staleness is not None or not off else 1
        serving = serve_policy(
            self.model, self.tokenizer, POLICY_NAME, off, settings.vllm_server, settings.vllm_prefix_token_ids
        )
        with serving as served:
            self.served = served
            config = stack_config(
                self.spec, served.url, settings.configs, settings.overrides, served.prefix_token_ids
            )
            self.masked_bound = masked_share_bound(settings.max_masked_share, served.prefix_token_ids)
            if not served.prefix_token_ids:
                bound = self.masked_bound
                self.echo(
                    f"{settings.vllm_server}: no required_prefix_token_ids (--vllm-prefix-token-ids not "
                    "given), so multi-turn prompts after the first are rendered from text: counted as "
                    f"retemplated_turns, drifted rollouts masked; masked-share alarm at {bound:.0%}"
                )
            dynamic = settings.dynamic_sampling
            self.collector = TokenCollector(
                self.blend,
                self.out / "rollouts" / "train.jsonl",
                stack_config=config,
                limits=Limits(concurrency=settings.concurrency),
                sampling=sampling,
                step_timeout_s=settings.step_timeout_s,
                overwrite=True,
                max_masked_share=self.masked_bound,
                staleness=StalenessBound(
                    self.staleness_bound, settings.on_stale, served.weight_sync.published
                ),
                dynamic_sampling=DynamicSampling(dynamic) if dynamic is not None else None,
            )
            with self.collector:
                self.grpo = PolygymGRPO(
                    self.collector,
                    settings.steps,
                    on_step=self.step,
                    gradient_share=settings.gradient_share,
                    weight_sync=served.weight_sync,
                    off_policy=OffPolicy(settings.is_cap) if off else None,
                )
                self.grpo.next_step = self.start  # the trainer skips the generation batches it trained
                yield

    # -- validate ------------------------------------------------------------------------------------
    def validate(self, step: int, final: bool = False) -> dict[str, float]:
        """Validate the policy after ``step`` updates: the rollouts, a curve line per environment,
        the values for the trainer's next log record, the ``--max-regression`` alarms. Step 0 with
        an environment that scored nothing stops the run (``require_scored``)."""
        settings = self.settings
        t = time.perf_counter()
        path = validation_file(self.out, step, final)
        rewards = validate(
            self.collector, self.validation, path, settings.validation_limit, settings.max_output_tokens
        )
        if step == 0 and not final:
            require_scored(rewards, path, self.validation)
        append_jsonl(validation_lines(step, rewards, self.validation), self.curves_path)
        means = mean_rewards(rewards)
        phase = "before" if step == 0 and not final else "after" if final else f"at step {step}"
        took = time.perf_counter() - t
        if step == 0 and not final:
            self.timings["validation_before_s"] = took
        if final:
            self.timings["validation_after_s"] = took
        self.echo(f"validation {phase}: {rewards_line(means)} ({took:.0f}s)")
        if step or final:
            found = self.regressions(step, final)
            for regression in found:
                self.echo(f"warning: {regression.describe()}")
            self.regressed.extend(found)
            if found and settings.on_regression == "stop" and not final:
                self.trainer.control.should_training_stop = True  # after this step's update
                self.echo(f"stopping after step {step}: --on-regression stop")
        if final:
            if values := validation_metrics(means):
                self.trainer.log(values)  # the last record: through report_to too
        else:
            self.grpo.log_metrics(validation_metrics(means))
        return means

    def regressions(self, step: int, final: bool = False) -> list[Regression]:
        """The ``--max-regression`` alarms of the validation after ``step`` updates (none if absent)."""
        base, now = validation_file(self.out, 0), validation_file(self.out, step, final)
        if not now.exists():
            return []
        agents = {env.name: env.agent for env in self.validation.environments}
        return regressions(step, base, now, self.settings.max_regression, agents)

    # -- step ----------------------------------------------------------------------------------------
    def train(self) -> None:
        """TRL's ``GRPOTrainer`` over the blend's steps (each one collected and handed to ``step``)."""
        settings = self.settings
        trainer_settings = {
            "learning_rate": settings.learning_rate,
            "lr_scheduler_type": "constant",
            "warmup_steps": 0,
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            **({"seed": settings.seed} if settings.seed is not None else {}),
            **self.served.trainer_settings,
            **checkpoint_config(settings.checkpoint_every),
            "report_to": list(settings.report_to) or "none",
            **settings.trainer_overrides,
        }
        self.args = self.grpo.grpo_config(self.out / TRAINER_DIR, **trainer_settings)
        self.trainer = self.grpo.trainer(self.model, self.tokenizer, self.args, callbacks=[marker_callback()])
        t = time.perf_counter()
        resume = str(self.resume_from[0]) if self.resume_from is not None else None
        self.trainer.train(resume_from_checkpoint=resume)
        self.timings["train_s"] = time.perf_counter() - t

    def step(self, step: TokenStep) -> None:
        """A collected step, before its update (``rollout_func`` hands over step k after k updates):
        a validation every ``--validate-every``, the masked-share alarms, its log lines."""
        settings = self.settings
        every = settings.validate_every
        if every and step.step and step.step % every == 0:
            self.validate(step.step)
            save_progress(self.out, self.trainer.state.log_history, settings.model)  # a killed run keeps them
        alarmed = [env for env, s in step.stats.items() if env != ALL_ENVS and s.masked_alarm]
        for env in alarmed:
            self.echo(
                f"warning: step {step.step}: {step.stats[env].masked_share:.0%} of {env}'s rollouts "
                f"masked (--max-masked-share {self.masked_bound})"
            )
        if alarmed and settings.on_masked == "stop":
            self.trainer.control.should_training_stop = True
            self.echo(f"stopping after step {step.step}: --on-masked stop")
        self.steps.append(step)
        append_jsonl(step.log_lines(), self.log_path)
        self.echo(step_line(step))

    # -- report --------------------------------------------------------------------------------------
    def report(self) -> RunResult:
        """``comparison.json``, the final curves and trainer log, ``summary.json``."""
        settings = self.settings
        comparison = final_comparison(self.out, self.echo)
        save_progress(self.out, self.trainer.state.log_history, settings.model)
        lines = list(iter_jsonl(self.log_path))  # every step of the run, those before a resume too
        self.timings["total_s"] = time.perf_counter() - self.began
        generator = self.served.generator
        summary = {
            "settings": settings.to_dict(),
            "timings_s": {k: round(v, 1) for k, v in self.timings.items()},
            "trainer_seed": self.args.seed,
            "blend_seed": self.spec.seed,
            "validation_before": self.before,
            "validation_after": self.after,
            "regressions": comparison.regressions if comparison is not None else None,
            "validation_regressions": [asdict(r) for r in self.regressed],
            "generation": {
                "batches": generator.stats.batches,
                "sequences": generator.stats.sequences,
                "generated_tokens": generator.stats.generated_tokens,
                "seconds": round(generator.stats.seconds, 1),
            }
            if generator is not None
            else {"vllm_server": settings.vllm_server},
            "staleness_bound": {"max_staleness": self.staleness_bound, "on_stale": settings.on_stale},
            **run_totals(lines),
            "prefix_token_ids": self.served.prefix_token_ids,
            "max_masked_share": self.masked_bound,
            "masked_share": masked_shares(lines),
            "masked_alarms": [
                {"step": line["step"], "env": line["env"]}
                for line in lines
                if line["env"] != ALL_ENVS and line.get("masked_alarm")
            ],
            "token_shares": token_shares(lines),
            "dynamic_sampling": dynamic_totals(lines) if settings.dynamic_sampling is not None else None,
            "resumed_at_step": self.start if self.resume_from is not None else None,
            "starved_environments": self.step_plan.starved,
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return RunResult(self.out, self.steps, comparison, self.timings, summary)


def train_run(settings: RunSettings, echo: Any = print, policy: tuple[Any, Any] | None = None) -> RunResult:
    """Run everything the module docstring lists; ``echo`` receives progress lines. ``policy``:
    a ``(model, tokenizer)`` already loaded (trained in place) instead of ``settings.model``'s."""
    return TrainingRun(settings, echo, policy).run()
