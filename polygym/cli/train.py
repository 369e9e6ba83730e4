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
from polygym.cli.settings_options import given, settings_from, settings_options
from polygym.collect.dataset import DatasetError
from polygym.jsonl import count_rows
from polygym.net.client import ServerCallError
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError
from polygym.training.run_settings import POLICY_FIELDS, RunSettings


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


def check_off_policy_options(settings: RunSettings, is_cap_given: bool) -> None:
    """Exit 2 naming an option the off-policy and vLLM settings cannot honour together."""
    vllm_server = settings.vllm_server
    if settings.vllm_prefix_token_ids and vllm_server is None:
        fail(
            "--vllm-prefix-token-ids needs --vllm-server (polygym's own server always extends ids)",
            EXIT_USAGE,
        )
    if settings.off_policy and settings.max_staleness == 0:
        fail(
            "--max-staleness 0 refuses every rollout --off-policy trains (they are 1 step stale)", EXIT_USAGE
        )
    if is_cap_given and not settings.off_policy:
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


def policy_options(command: Any) -> Any:
    """The spec, stack, policy and sampling options of every command that trains (`gym train run`,
    `gym train compare-mixes`): one declaration (``RunSettings``), so the two cannot drift apart."""
    return settings_options(RunSettings, POLICY_FIELDS)(command)


def require_training_extra(command: str) -> None:
    """Exit 2 when the training extra is missing, before any work; torch threads wait passively."""
    passive_omp_threads()
    try:
        import torch  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        fail(f"{command} needs the training extra: pip install -e '.[train]'", EXIT_USAGE)


@train.command("run")
@settings_options(RunSettings)
def run(**values: Any) -> None:
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
    check_report_to(values["report_to"])
    from polygym.cli.compare import print_comparison
    from polygym.training.models import ModelLoadError
    from polygym.training.run import train_run
    from polygym.training.validation import EnvironmentFailing

    settings = settings_from(
        RunSettings, values, max_regression=parse_max_regressions(values["max_regression"])
    )
    check_off_policy_options(settings, is_cap_given=given("is_cap"))
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
    total = result.timings.get("total_s", 0)
    out.print(f"done in {total:.0f}s ({escape(timings)}); files in {escape(str(settings.output_dir))}")


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
@settings_options(
    RunSettings,
    ("steps", "validate_every", "seed"),
    changes={
        "steps": {"default": 20, "help": "Steps per arm."},
        "validate_every": {
            "help": "Validate every environment every N steps too (besides step 0 and the end)."
        },
        "seed": {"help": "Trainer seed of every arm (default: the spec's seed)."},
    },
)
def compare_mixes_command(arms: tuple[str, ...], **values: Any) -> None:
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
    from polygym.training.validation import EnvironmentFailing

    try:
        parsed = tuple(parse_arm(text) for text in arms)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    run_settings = settings_from(RunSettings, values)
    out = console()
    try:
        compare_mixes(
            CompareSettings(run_settings.spec_path, run_settings.output_dir, parsed, run_settings),
            echo=lambda line: out.print(escape(line)),
        )
    except (BlendSpecError, DatasetError, ConfigError, ModelLoadError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    except (LaunchError, ServerCallError, EnvironmentFailing) as exc:
        fail(str(exc), EXIT_FAILURE)
    out.print((run_settings.output_dir / "table.md").read_text())
