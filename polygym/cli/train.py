"""``gym train``: plan and run multi-environment training.

``gym train plan SPEC`` shows what every step of a blend will hold before any GPU is spent
(``gym eval run --blend SPEC --steps N`` collects those steps: ``polygym.cli.blend_run``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.blend.mix import resolve
from polygym.blend.planner import (
    DEFAULT_WARN_BELOW,
    DEFAULT_WARN_BELOW_ROLLOUTS,
    InfeasiblePlanError,
    Plan,
    plan_summary_rows,
)
from polygym.blend.spec import BlendSpec, BlendSpecError
from polygym.cli.base import (
    EXIT_FAILURE,
    EXIT_USAGE,
    SuggestingGroup,
    console,
    fail,
)
from polygym.cli.blend_run import load_spec_or_exit
from polygym.collect.dataset import DatasetError
from polygym.jsonl import count_rows
from polygym.net.client import ServerCallError
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError
from polygym.training.off_policy import DEFAULT_IS_CAP
from polygym.training.policy_serving import RETEMPLATED_MASKED_SHARE
from polygym.training.policy_version import ON_STALE, OnStale
from polygym.training.trl_adapter import GRADIENT_SHARES, GradientShare


@click.group(cls=SuggestingGroup)
def train() -> None:
    """Plan and run training on a blend of environments."""


@train.command("plan")
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--warn-below",
    type=click.IntRange(min=0),
    default=DEFAULT_WARN_BELOW,
    show_default=True,
    help="Warn when an environment gets fewer prompts than this per step.",
)
@click.option(
    "--warn-below-rollouts",
    type=click.IntRange(min=0),
    default=DEFAULT_WARN_BELOW_ROLLOUTS,
    show_default=True,
    help="Warn when an environment gets fewer rollouts (prompts x responses) than this per step.",
)
@click.option("--prompts-per-step", type=click.IntRange(min=1), default=None, help="Try another step size.")
def plan(
    spec_path: Path, as_json: bool, warn_below: int, warn_below_rollouts: int, prompts_per_step: int | None
) -> None:
    """Show each environment's exact quota of every training step.

    Quotas use largest remainder on the weights after giving every environment its
    min_per_step; the global batch is prompts_per_step x responses_per_prompt.
    """
    spec = load_spec_or_exit(spec_path)
    if prompts_per_step is not None:
        spec = spec.model_copy(update={"prompts_per_step": prompts_per_step})
    try:
        rows = {env.name: sum(count_rows(p) for p in env.train) for env in resolve(spec)}
        result = spec.plan(rows, warn_below, warn_below_rollouts)
    except BlendSpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except InfeasiblePlanError as exc:
        fail(f"{spec_path}: {exc}", EXIT_USAGE)
    if as_json:
        click.echo(orjson.dumps({"spec": str(spec_path), **result.to_dict()}, option=orjson.OPT_INDENT_2))
        return
    print_plan(result, spec)


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else "-" if value is None else str(value)


def print_plan(result: Plan, spec: BlendSpec) -> None:
    out = console()
    table = Table(title=f"step plan of {escape(spec.source)}", title_justify="left")
    columns = ("environment", "weight", "target share", "min", "prompts/step", "planned share")
    for column in (*columns, "rollouts/step", "rows", "steps/epoch"):
        table.add_column(column, justify="left" if column == "environment" else "right")
    for row in plan_summary_rows(result):
        quota = str(row["quota"]) + (" (min)" if row["pinned"] else "")
        table.add_row(
            row["name"],
            f"{row['weight']:g}",
            f"{row['target_share']:.1%}",
            str(row["min_per_step"]),
            quota,
            f"{row['planned_share']:.1%}",
            str(row["rollouts_per_step"]),
            _num(row["rows"]),
            _num(row["steps_per_epoch"], 1),
        )
    out.print(table)
    out.print(
        f"global batch: {result.prompts_per_step} prompts x {result.responses_per_prompt} responses = "
        f"{result.global_batch_size} rollouts per step"
    )
    out.print(
        f"smallest prompts_per_step meeting every minimum: {result.min_prompts_per_step}; "
        f"smallest with no warnings: {result.suggested_prompts_per_step}"
    )
    for warning in result.warnings:
        out.print(f"[yellow]warning:[/] {escape(warning)}")


# ------------------------------------------------------------------------------ gym train run


def passive_omp_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning (unless the user chose otherwise).

    Must happen before torch is imported. With the default spin-waiting, two torch threads on a
    two-core machine where anything else runs are 5-6x *slower* than one (measured: a forward pass
    of SmolLM2-135M went from 1.4 s to 8.4 s); passive waiting removes that cliff at no cost.
    """
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def parse_max_regressions(values: tuple[str, ...]) -> dict[str, float]:
    """``ENV=DELTA`` flags as a mapping; exits 2 naming a malformed one."""
    limits: dict[str, float] = {}
    for text in values:
        env, sep, delta = text.partition("=")
        try:
            limits[env] = float(delta)
        except ValueError:
            sep = ""
        if not sep or not env or not math.isfinite(limits.get(env, math.nan)) or limits[env] < 0:
            fail(f"--max-regression '{text}': expected ENV=DELTA with DELTA a number >= 0", EXIT_USAGE)
    return limits


def check_off_policy_options(
    off_policy: bool,
    max_staleness: int | None,
    is_cap: float | None,
    vllm_server: str | None,
    vllm_prefix_token_ids: bool,
) -> None:
    """Exit 2 naming an option the off-policy and vLLM settings cannot honour together."""
    if vllm_prefix_token_ids and vllm_server is None:
        fail(
            "--vllm-prefix-token-ids needs --vllm-server (polygym's own server always extends ids)",
            EXIT_USAGE,
        )
    if off_policy and max_staleness == 0:
        fail(
            "--max-staleness 0 refuses every rollout --off-policy trains (they are 1 step stale)", EXIT_USAGE
        )
    if is_cap is not None and not off_policy:
        fail("--is-cap needs --off-policy (on-policy rollouts need no correction)", EXIT_USAGE)
    if vllm_server is not None and not vllm_server.startswith(("http://", "https://")):
        fail(f"--vllm-server {vllm_server!r} must be an http:// or https:// URL", EXIT_USAGE)
    if vllm_server is not None:
        from polygym.training.policy_serving import vllm_trainer_problem

        problem = vllm_trainer_problem()
        if problem is not None:
            fail(f"--vllm-server {problem}", EXIT_USAGE)


def check_report_to(backends: tuple[str, ...]) -> None:
    """Exits 2 naming a ``--report-to`` backend whose package is not installed."""
    if not backends:
        return
    from transformers.integrations import get_available_reporting_integrations

    available = get_available_reporting_integrations()
    for backend in backends:
        if backend not in available:
            installed = ", ".join(available) or "none"
            fail(f"--report-to {backend}: not installed (installed: {installed})", EXIT_USAGE)


_POLICY_OPTIONS = (
    click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path)),
    click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]..."),
    click.option(
        "--output", "-o", type=click.Path(path_type=Path), required=True, help="Folder for every file."
    ),
    click.option(
        "--model", default="smollm2-135m", show_default=True, help="Known model name, GGUF file or HF folder."
    ),
    click.option(
        "--learning-rate", "--lr", type=float, default=1e-4, show_default=True, help="Constant learning rate."
    ),
    click.option("--temperature", type=float, default=1.0, show_default=True, help="Sampling temperature."),
    click.option(
        "--max-output-tokens", type=click.IntRange(min=1), default=None, help="Default: each row's own."
    ),
    click.option(
        "--validation-limit", type=click.IntRange(min=1), default=None, help="Validation rows per env."
    ),
    click.option(
        "--config", "configs", multiple=True, help="Extra config file merged into the stack (repeatable)."
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=64,
        show_default=True,
        help="Rollouts in flight at once, shared out between the environments of a step.",
    ),
    click.option(
        "--threads", type=click.IntRange(min=1), default=None, help="Torch threads (default: all cores)."
    ),
    click.option(
        "--train-layers", type=click.IntRange(min=1), default=None, help="Train only the top N blocks."
    ),
)


def policy_options(command: Any) -> Any:
    """The spec, stack, policy and sampling options of every command that trains (`gym train run`,
    `gym train compare-mixes`): one definition, so the two cannot drift apart."""
    for option in reversed(_POLICY_OPTIONS):
        command = option(command)
    return command


def require_training_extra(command: str) -> None:
    """Exit 2 when the training extra is missing, before any work; torch threads wait passively."""
    passive_omp_threads()
    try:
        import torch  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        fail(f"{command} needs the training extra: pip install -e '.[train]'", EXIT_USAGE)


@train.command("run")
@policy_options
@click.option("--steps", type=click.IntRange(min=1), default=24, show_default=True, help="Optimizer steps.")
@click.option("--step-timeout", type=float, default=None, help="Seconds per step before stragglers are cut.")
@click.option("--save-model", is_flag=True, help="Save the trained weights to OUTPUT/model.")
@click.option(
    "--gradient-share",
    type=click.Choice(GRADIENT_SHARES),
    default="tokens",
    show_default=True,
    help="How the loss splits between environments. tokens: every trained token weighs 1, so an "
    "environment with longer episodes takes more of the gradient than of the prompts. plan: scale each "
    "environment's per-token loss weight so its share of the gradient equals its planned share. "
    "train_log.jsonl reports trained_token_share and gradient_share per environment and step.",
)
@click.option(
    "--validate-every",
    type=click.IntRange(min=1),
    default=None,
    help="Also validate every N steps (greedy, the same rows each time), besides before and after; "
    "every validation adds a line per environment (eval_only ones included) to OUTPUT/validation.jsonl.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seed of the trainer (TRL and torch: sampling, dropout, any initialization), separate from "
    "the blend spec's seed, which alone decides the prompts of every step. Default: the spec's seed.",
)
@click.option(
    "--max-regression",
    "max_regressions",
    multiple=True,
    metavar="ENV=DELTA",
    help="Warn when ENV's mean validation reward fell more than DELTA since step 0 and the 95% "
    "paired-bootstrap interval of the drop (over the same prompts) excludes 0, at any validation "
    "(--validate-every) and at the end; a validation with no scored rollout of ENV also warns. The "
    "warning shows the drop and its interval (repeatable; summary.json lists them; rule in "
    "docs/multi_env_batches.md).",
)
@click.option(
    "--on-regression",
    type=click.Choice(["warn", "stop"]),
    default="warn",
    show_default=True,
    help="stop: also end training after the step whose validation regressed.",
)
@click.option(
    "--max-masked-share",
    type=click.FloatRange(min=0, max=1),
    default=None,
    metavar="SHARE",
    help="Alarm when more than SHARE of an environment's rollouts in a step are masked (trained on "
    "nothing: history drift the model server could not avoid, missing token ids): a warning, "
    "masked_alarm in train_log.jsonl and the trainer's metrics. Every step reports masked_share.",
)
@click.option(
    "--on-masked",
    type=click.Choice(["warn", "stop"]),
    default="warn",
    show_default=True,
    help="stop: also end training after the step whose masked share passed --max-masked-share.",
)
@click.option(
    "--max-staleness",
    type=click.IntRange(min=0),
    default=None,
    help="The most optimizer steps a trained rollout may lag the policy that trains on it (every "
    "rollout is stamped with the policy version that generated it). Default: no bound, 1 with "
    "--off-policy. train_log.jsonl records each step's versions and staleness.",
)
@click.option(
    "--on-stale",
    type=click.Choice(ON_STALE),
    default="refuse",
    show_default=True,
    help="refuse: mask rollouts staler than --max-staleness (no gradient; reward still reported); "
    "report: train on them and count them.",
)
@click.option(
    "--off-policy",
    is_flag=True,
    help="One-step off-policy: collect step N+1 while step N trains (the generator serves a copy of "
    "the weights, synced before each step), with a truncated importance-sampling correction from the "
    "recorded generation log-probs; each step's IS ratios go to train_log.jsonl.",
)
@click.option(
    "--is-cap",
    type=click.FloatRange(min=1.0),
    default=None,
    help=f"Truncation of the --off-policy importance ratio (default {DEFAULT_IS_CAP}).",
)
@click.option(
    "--vllm-server",
    default=None,
    metavar="URL",
    help="Generate with a vLLM server (http://host:8000) fed the trainer's weights by TRL's server mode "
    "(use_vllm=True) before each step, instead of the in-process generation server. Needs a CUDA "
    "trainer and vllm installed; recipe in examples/train_grpo_vllm/. Multi-turn prompts after the "
    "first are then rendered from the history's text (counted as retemplated_turns; a drifted rollout "
    f"is masked; masked-share alarm at {RETEMPLATED_MASKED_SHARE:.0%} unless --max-masked-share says "
    "otherwise).",
)
@click.option(
    "--vllm-prefix-token-ids",
    is_flag=True,
    help="The --vllm-server implements NeMo Gym's required_prefix_token_ids extension (NeMo RL's vLLM "
    "server does; stock vllm serve and trl vllm-serve do not): multi-turn prompts then extend the exact "
    "ids generated instead of re-rendering the history. A server without it fails drifted turns (502).",
)
@click.option(
    "--allow-starved",
    "allow_starved",
    multiple=True,
    metavar="ENV",
    help="Train although the plan gives ENV 0 prompts in every step (it is still validated). Without "
    "it such a plan exits 2; every warning of the plan (gym train plan) is shown before step 0 "
    "(repeatable).",
)
@click.option(
    "--dynamic-sampling",
    type=click.IntRange(min=1),
    default=None,
    metavar="MAX_EXTRA",
    help="Replace prompt groups whose rewards all agree (no GRPO signal) with groups of extra prompts "
    "from the same environment, so every environment keeps its exact quota; each environment draws at "
    "most MAX_EXTRA extra prompts per step, and slots still without signal are counted as unfilled. "
    "train_log.jsonl's dynamic_sampling field says, per environment and step, what was drawn, seen and "
    "dropped. Default: off.",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Save a checkpoint (weights, optimizer, RNG states, trainer state) to OUTPUT/trainer every N "
    "steps, keeping the last two (each up to about 3x the float32 model: weights and Adam state). "
    "Default: none.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in OUTPUT from its last checkpoint: the same settings are required, steps "
    "after the checkpoint are collected again with the same prompts and quotas, and every file holds "
    "each step exactly once.",
)
@click.option(
    "--report-to",
    "report_to",
    multiple=True,
    metavar="BACKEND",
    help="Send every log record (TRL's and polygym/<env>/... per environment: reward, tokens, "
    "truncated_share, zero_variance_share, masked_share, validation_reward) to a transformers "
    "integration: tensorboard, wandb, mlflow... (repeatable; the backend's package must be installed). "
    "Default: none (trainer_log.jsonl holds the same records).",
)
def run(
    spec_path: Path,
    overrides: tuple[str, ...],
    output: Path,
    model: str,
    steps: int,
    learning_rate: float,
    temperature: float,
    max_output_tokens: int | None,
    validation_limit: int | None,
    configs: tuple[str, ...],
    concurrency: int,
    step_timeout: float | None,
    threads: int | None,
    train_layers: int | None,
    save_model: bool,
    gradient_share: GradientShare,
    validate_every: int | None,
    seed: int | None,
    max_regressions: tuple[str, ...],
    on_regression: str,
    max_masked_share: float | None,
    on_masked: str,
    max_staleness: int | None,
    on_stale: OnStale,
    off_policy: bool,
    is_cap: float | None,
    vllm_server: str | None,
    vllm_prefix_token_ids: bool,
    allow_starved: tuple[str, ...],
    dynamic_sampling: int | None,
    checkpoint_every: int | None,
    resume: bool,
    report_to: tuple[str, ...],
) -> None:
    """Train a policy with GRPO (TRL) on the blend SPEC, on this machine, and compare validation.

    The policy is served from the weights being trained, so every rollout is on-policy; every
    environment of SPEC (eval_only ones too: watched, not trained) is validated before and after
    (and every --validate-every steps, into validation.jsonl). Writes run.json (the settings),
    train_log.jsonl (reward per environment and step), trainer_log.jsonl (every log record, the
    per-environment polygym/<env>/... values included), curves.png, validation_before/after files,
    comparison.json and summary.json to --output; with --checkpoint-every, checkpoints that
    --resume continues from. KEY=VALUE overrides the stack config. Needs `pip install -e
    '.[train]'` (see README "Training").
    """
    require_training_extra("gym train run")
    check_report_to(report_to)
    from polygym.cli.compare import print_comparison
    from polygym.training.models import ModelLoadError
    from polygym.training.run import RunSettings, train_run
    from polygym.training.validation import EnvironmentFailing

    check_off_policy_options(off_policy, max_staleness, is_cap, vllm_server, vllm_prefix_token_ids)
    settings = RunSettings(
        spec_path=spec_path,
        output_dir=output,
        model=model,
        steps=steps,
        learning_rate=learning_rate,
        temperature=temperature,
        max_output_tokens=max_output_tokens,
        validation_limit=validation_limit,
        configs=configs,
        overrides=overrides,
        concurrency=concurrency,
        step_timeout_s=step_timeout,
        threads=threads,
        train_layers=train_layers,
        save_model=save_model,
        gradient_share=gradient_share,
        validate_every=validate_every,
        seed=seed,
        max_regression=parse_max_regressions(max_regressions),
        on_regression=on_regression,
        max_masked_share=max_masked_share,
        on_masked=on_masked,
        max_staleness=max_staleness,
        on_stale=on_stale,
        off_policy=off_policy,
        is_cap=DEFAULT_IS_CAP if is_cap is None else is_cap,
        vllm_server=vllm_server,
        vllm_prefix_token_ids=vllm_prefix_token_ids,
        allow_starved=allow_starved,
        dynamic_sampling=dynamic_sampling,
        checkpoint_every=checkpoint_every,
        resume=resume,
        report_to=report_to,
    )
    out = console()
    try:
        result = train_run(settings, echo=lambda line: out.print(escape(line)))
    except (BlendSpecError, DatasetError, ConfigError, ModelLoadError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    except (LaunchError, ServerCallError, EnvironmentFailing) as exc:
        fail(str(exc), EXIT_FAILURE)
    if result.comparison is not None:
        print_comparison(result.comparison)
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in result.timings.items())
    out.print(
        f"done in {result.timings.get('total_s', 0):.0f}s ({escape(timings)}); files in {escape(str(output))}"
    )


# ---------------------------------------------------------------------- gym train compare-mixes


@train.command("compare-mixes")
@policy_options
@click.option(
    "--arm",
    "arms",
    multiple=True,
    required=True,
    metavar="NAME=ENV[,ENV...]",
    help="A mix to train: its name (a folder of --output) and the environments of SPEC it trains; every "
    "other environment of SPEC is validated, not trained (repeatable, at least two).",
)
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Steps per arm.")
@click.option(
    "--validate-every",
    type=click.IntRange(min=1),
    default=None,
    help="Validate every environment every N steps too (besides step 0 and the end).",
)
@click.option("--seed", type=int, default=None, help="Trainer seed of every arm (default: the spec's seed).")
def compare_mixes_command(
    spec_path: Path,
    overrides: tuple[str, ...],
    arms: tuple[str, ...],
    output: Path,
    model: str,
    steps: int,
    learning_rate: float,
    temperature: float,
    max_output_tokens: int | None,
    validation_limit: int | None,
    validate_every: int | None,
    seed: int | None,
    configs: tuple[str, ...],
    concurrency: int,
    threads: int | None,
    train_layers: int | None,
) -> None:
    """Train each --arm (a subset of SPEC's environments) from the same initial weights, with the
    same seed and steps, validating every environment of SPEC in every arm: does training on one
    environment hurt the others, and does the mix help?

    One process, the policy loaded once and restored before each arm. Writes OUTPUT/<arm>/ (a
    `gym train run` folder each) and, across arms, table.md/table.json (per environment: delta vs
    step 0 with a paired 95% interval, McNemar's exact test on the same prompts, mean output tokens;
    each arm's worst-environment delta), curves.png/curves.jsonl and samples.md.
    """
    require_training_extra("gym train compare-mixes")
    from polygym.training.compare_mixes import CompareSettings, compare_mixes, parse_arm
    from polygym.training.models import ModelLoadError
    from polygym.training.run import RunSettings
    from polygym.training.validation import EnvironmentFailing

    try:
        parsed = tuple(parse_arm(text) for text in arms)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    run_settings = RunSettings(
        spec_path=spec_path,
        output_dir=output,
        model=model,
        steps=steps,
        learning_rate=learning_rate,
        temperature=temperature,
        max_output_tokens=max_output_tokens,
        validation_limit=validation_limit,
        configs=configs,
        overrides=overrides,
        concurrency=concurrency,
        threads=threads,
        train_layers=train_layers,
        validate_every=validate_every,
        seed=seed,
    )
    out = console()
    try:
        compare_mixes(
            CompareSettings(spec_path, output, parsed, run_settings),
            echo=lambda line: out.print(escape(line)),
        )
    except (BlendSpecError, DatasetError, ConfigError, ModelLoadError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    except (LaunchError, ServerCallError, EnvironmentFailing) as exc:
        fail(str(exc), EXIT_FAILURE)
    out.print((output / "table.md").read_text())
