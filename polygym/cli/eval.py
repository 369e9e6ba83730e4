"""``gym eval run``: collect rollouts for a dataset across environments, routed by ``agent_ref``."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    GIVEN,
    SuggestingGroup,
    console,
    fail,
    refuse_given,
    selector_options,
)
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.lazy import LazyCommands
from polygym.cli.placement_options import refuse_when_joining
from polygym.cli.run_end import (
    STACK_ERRORS,
    end_of_run,
    print_counts,
    print_interrupted,
    resume_command,
    stack_error,
)
from polygym.cli.run_options import stack_options, stack_target
from polygym.cli.server_health import upstream_problems
from polygym.cli.settings_options import settings_from, settings_options
from polygym.cli.stack_deaths import report_deaths, server_deaths, server_needs
from polygym.collect.dataset import DatasetError, load_jobs
from polygym.collect.eval_run import RunSummary, run_eval
from polygym.collect.eval_settings import SAMPLING_OPTIONS, EvalRunSettings, PerAgent
from polygym.collect.health import QUARANTINED, HealthMonitor
from polygym.collect.job_plan import MAX_NUM_REPEATS, JobPlan
from polygym.collect.rollouts import MAX_CONCURRENCY
from polygym.collect.row_overrides import ROW_PARAMS, RowOverrides, split_overrides
from polygym.collect.run_files import RunFiles
from polygym.collect.sampling import sampling_problems
from polygym.collect.stack_watch import StackHealth
from polygym.collect.task_source import TaskRoutes, head_task_routes, task_routes
from polygym.errors import ConfigError
from polygym.event_loop import run_async
from polygym.net.client import ServerCallError, ServerClient
from polygym.settings import cli
from polygym.stack.session import StackSession, StackTarget
from polygym.suggest import unknown_name_message

if TYPE_CHECKING:
    from polygym.blend.stepwise import StepSettings


def _compare() -> click.Command:
    from polygym.cli.compare import compare_command

    return compare_command


def _health_check() -> click.Command:
    from polygym.cli.health import health_check_command

    return health_check_command


def _reverify() -> click.Command:
    from polygym.cli.reverify import reverify_command

    return reverify_command


@click.group(
    cls=SuggestingGroup,
    commands=LazyCommands({"compare": _compare, "health-check": _health_check, "reverify": _reverify}),
)
def eval_group() -> None:
    """Collect and compare rollouts."""


@dataclass(frozen=True)
class NemoGymEvalFlags:
    """NeMo Gym's ``gym eval run`` flags that polygym accepts only to refuse by name (exit 2, the
    reasons in ``NEMO_GYM_ONLY``): declared like settings so ``--help`` lists them."""

    no_health_check: bool = field(default=False, metadata=cli("NeMo Gym's post-run health check: refused."))
    health_check_workers: int | None = field(
        default=None, metadata=cli("NeMo Gym's health-check workers: refused.")
    )
    health_check_ignore: tuple[str, ...] = field(
        default=(), metadata=cli("NeMo Gym's health-check filter: refused.", metavar="CHECK")
    )
    split: str | None = field(
        default=None, metadata=cli("NeMo Gym's dataset split: refused (pass the split's JSONL as --input).")
    )
    prompt_config: str | None = field(
        default=None, metadata=cli("NeMo Gym's prompt template: refused (rows hold their prompts).")
    )


@eval_group.command("run")
@selector_options
@settings_options(EvalRunSettings)
@stack_options
@settings_options(NemoGymEvalFlags)
@click.pass_context
def run(ctx: click.Context, **opts: Any) -> None:
    """Collect rollouts for every row of --input into --output (plus failures and metrics files).

    \b
    With a stack running (gym env start ...):
      gym eval run --no-serve --input data.jsonl --output results/out.jsonl
    Or start the stack for this run only:
      gym eval run --model-type openai_model --resources-server example_single_tool_call \\
          --input data.jsonl --output results/out.jsonl
    """
    refuse_given(ctx, NEMO_GYM_ONLY)
    from_overrides = apply_row_overrides(ctx, opts)
    if (opts["input_path"] is None) == (opts["blend_path"] is None):
        fail("pass exactly one of --input FILE or --blend SPEC", EXIT_USAGE)
    if opts["output_path"] is None:
        fail("pass --output FILE (or +output_jsonl_fpath=FILE)", EXIT_USAGE)
    refuse_given(ctx, NOT_WITH_BLEND if opts["blend_path"] is not None else BLEND_ONLY)
    refuse_when_joining(ctx, opts)
    if opts["blend_path"] is not None:
        _refuse_with_blend(from_overrides)
    settings = eval_settings(opts)
    if settings.blend_path is None:
        sys.exit(run_async(_run(stack_target(opts), settings)))
    if settings.steps is None:
        fail("--blend needs --steps N", EXIT_USAGE)
    from polygym.cli.blend_run import load_spec_or_exit, run_blend  # blending's imports, for --blend only

    spec = load_spec_or_exit(settings.blend_path)
    target = stack_target(opts, spec)
    sys.exit(
        run_async(
            run_blend(
                spec,
                target,
                settings.output,
                _step_settings(settings),
                settings.overwrite,
                settings.max_failures,
            )
        )
    )


_NOT_WITH = "does not apply with --blend:"
NOT_WITH_BLEND = {
    "num_repeats": f"{_NOT_WITH} the spec's responses_per_prompt sets the responses per prompt",
    "limit": f"{_NOT_WITH} the spec's prompts_per_step and --steps set how many rows are used",
    "agent": f"{_NOT_WITH} the spec names each environment's agent",
    "progress_interval_s": f"{_NOT_WITH} one line is printed per finished step",
    "allow_stack_change": f"{_NOT_WITH} step-wise runs check their steps, not their stack",
    "quarantine_rate": f"{_NOT_WITH} every step keeps each environment's quota",
    "quarantine_min": f"{_NOT_WITH} every step keeps each environment's quota",
    "interleave_repeats": f"{_NOT_WITH} each step sends its prompts' responses together",
    "disable_aggregation": f"{_NOT_WITH} step-wise runs always write their metrics file",
}
"""Options of ``gym eval run`` that only mean something for ``--input``, and why."""
BLEND_ONLY = {name: "only applies with --blend SPEC" for name in ("steps", "start_step", "step_timeout_s")}
"""Options of ``gym eval run`` that only mean something for ``--blend``."""
NEMO_GYM_ONLY = {
    "split": "cannot be honoured: polygym does not prepare datasets by split; pass the split's JSONL "
    "with --input",
    "prompt_config": "cannot be honoured: polygym does not render prompt templates; pass rows that "
    "hold their prompts",
    **dict.fromkeys(
        ("no_health_check", "health_check_workers", "health_check_ignore"),
        "cannot be honoured: polygym runs no post-run health check to skip or tune; it watches rollout "
        "health as results arrive (health/* metrics; --quarantine-rate 1 never quarantines) and "
        "gym eval health-check reports on a finished run",
    ),
}
"""NeMo Gym's ``gym eval run`` flags that polygym accepts only to refuse by name (exit 2)."""

_ROW_OPTION_PARAM = {
    "--num-repeats": "num_repeats",
    "--limit": "limit",
    "--agent": "agent",
    "--input": "input_path",
    "--output": "output_path",
    "--concurrency": "concurrency",
    "--interleave-repeats": "interleave_repeats",
    "--disable-aggregation": "disable_aggregation",
}


def _refuse_with_blend(from_overrides: dict[str, str]) -> None:
    """What ``refuse_given`` does for flags, for the same settings given as NeMo Gym overrides."""
    problems = [
        f"override '{text}' {NOT_WITH_BLEND[name]}"
        for name, text in from_overrides.items()
        if name in NOT_WITH_BLEND
    ]
    if problems:
        fail("\n".join(problems), EXIT_USAGE)


def apply_row_overrides(ctx: click.Context, opts: dict[str, Any]) -> dict[str, str]:
    """Take NeMo Gym's collection overrides (``+num_repeats=3``, ``++responses_create_params.x=v``)
    out of ``opts["overrides"]`` and into the options they mean; exit 2 on one that cannot be
    honoured, or that repeats an option also given as a flag (which one to use would be a guess).
    Returns the options it set, each with the override's text."""
    try:
        parsed = _parsed_overrides(opts["overrides"])
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    config_overrides, row = split_overrides(parsed)
    problems = list(row.refused) + _take_row_options(ctx, opts, row)
    for key in row.sampling:
        if key in SAMPLING_OPTIONS and opts[key] is not None:
            problems.append(f"{ROW_PARAMS_FLAG}{key} and --{key.replace('_', '-')} both set {key}: pass one")
    if problems:
        fail("\n".join(problems), EXIT_USAGE)
    opts["overrides"] = tuple(config_overrides)
    opts["row_sampling"] = row.sampling
    return {_ROW_OPTION_PARAM[flag]: text for flag, (text, _) in row.options.items()}


def _parsed_overrides(texts: tuple[str, ...]) -> list[tuple[str, str, Any]]:
    """``(text, key, value)`` of each override; the config loader, and OmegaConf with it (~0.1 s
    of the start), is imported only for a run that passes some."""
    if not texts:
        return []
    from polygym.stack.config import parse_override

    return [(text, key, value) for text in texts for key, value, _ in [parse_override(text)]]


ROW_PARAMS_FLAG = f"{ROW_PARAMS}."


def _take_row_options(ctx: click.Context, opts: dict[str, Any], row: RowOverrides) -> list[str]:
    problems = []
    for flag, (text, value) in row.options.items():
        name = _ROW_OPTION_PARAM[flag]
        if ctx.get_parameter_source(name) in GIVEN:
            problems.append(f"override '{text}' and {flag} set the same thing: pass one")
        elif name in ("num_repeats", "concurrency"):
            opts[name] = (str(value),)
        elif name == "limit":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"override '{text}': limit must be a whole number of at least 1")
            opts[name] = value
        elif name in ("interleave_repeats", "disable_aggregation"):
            if not isinstance(value, bool):
                problems.append(f"override '{text}': {name} must be true or false")
            opts[name] = value is True
        elif name in ("input_path", "output_path"):
            opts[name] = Path(str(value))
        else:
            opts[name] = str(value)
    return problems


def eval_settings(opts: dict[str, Any]) -> EvalRunSettings:
    """The settings of click's options (``N|AGENT=N`` values parsed, the sampling fields of flags
    and overrides checked); exits 2 naming the option of a bad value."""
    per_agent = {}
    for name, maximum in (("num_repeats", MAX_NUM_REPEATS), ("concurrency", MAX_CONCURRENCY)):
        try:
            per_agent[name] = PerAgent.parse(opts[name], maximum)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=f"--{name.replace('_', '-')}") from None
    flags = {key: opts[key] for key in SAMPLING_OPTIONS if opts[key] is not None}
    sampling = {**opts.get("row_sampling", {}), **flags}
    for key, problem in sampling_problems(sampling):
        hint = f"--{key.replace('_', '-')}" if key in flags else f"{ROW_PARAMS_FLAG}{key}"
        raise click.BadParameter(problem, param_hint=hint)
    return settings_from(EvalRunSettings, opts, sampling=sampling, **per_agent)


def _step_settings(settings: EvalRunSettings) -> StepSettings:
    """The step-wise settings of a ``--blend`` run (``--resume`` continues after the last step)."""
    from polygym.blend.stepwise import StepSettings
    from polygym.cli.blend_run import next_step

    assert settings.steps is not None
    start = next_step(settings.output) if settings.resume else settings.start_step
    return StepSettings(
        settings.steps,
        start,
        settings.limits,
        settings.step_timeout_s,
        dict(settings.sampling),
        settings.seed,
    )


def _load(settings: EvalRunSettings, agents: list[str], routes: TaskRoutes | None = None) -> JobPlan:
    assert settings.input_path is not None
    materialization = settings.materialization
    default_agent = settings.agent
    if default_agent is not None and default_agent not in agents:
        fail(unknown_name_message("agent", default_agent, agents), EXIT_USAGE)
    if default_agent is None and len(agents) == 1:
        default_agent = agents[0]
    try:
        plan = load_jobs(settings.input_path, agents, default_agent, settings.limit, materialization, routes)
    except DatasetError as exc:
        fail(str(exc), EXIT_USAGE)
    targets = [*agents, *plan.result_types]  # agents, and the environment servers of materialized rows
    for agent in sorted(plan.agents() | set(materialization.repeats_by_agent)):
        if agent not in targets:
            fail(unknown_name_message("agent", agent, targets), EXIT_USAGE)
    return plan


async def _task_routes(target: StackTarget, session: StackSession) -> TaskRoutes:
    """Where rows with a ``task_source`` and no ``agent_ref`` go, and materialized task rows: from
    the config this run starts, or from the joined stack's head."""
    if target.config is not None:
        return task_routes(target.config.to_dict())
    assert session.client is not None
    return await head_task_routes(session.client)


async def _run(target: StackTarget, settings: EvalRunSettings) -> int:
    try:
        async with StackSession(target, settings.limits.concurrency) as session:
            plan = _load(settings, session.agents, await _task_routes(target, session))
            client = await session.connect()
            await _warn_unreachable_policies(client)
            if session.stack is None or target.config is None:
                return await _collect(client, plan, settings, None)
            health = StackHealth(server_needs(target.config))
            watch = asyncio.ensure_future(health.watch(server_deaths(session.stack)))
            try:
                return await _collect(client, plan, settings, health)
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
    except STACK_ERRORS as exc:
        return stack_error(exc)


async def _warn_unreachable_policies(client: ServerClient) -> None:
    """Before the first rollout, name each model server that cannot reach its upstream (its
    rollouts will fail, and the run will say so at the end): a warning, not a refusal, since an
    upstream may come up while the run starts."""
    try:
        servers = await client.servers()
    except ServerCallError:
        return  # the run itself will report a stack it cannot reach
    for problem in await upstream_problems([s for s in servers if isinstance(s, dict)]):
        console(stderr=True).print("[yellow]warning:[/]", escape(f"{problem}: its rollouts will fail"))


async def _collect(
    client: ServerClient, plan: JobPlan, settings: EvalRunSettings, health: StackHealth | None
) -> int:
    files = RunFiles(settings.output)
    work = run_eval(
        client,
        plan,
        files,
        settings.limits,
        settings.resume,
        settings.overwrite,
        settings.progress_interval_s,
        settings.allow_stack_change,
        health,
        HealthMonitor(settings.quarantine_rate, settings.quarantine_min, keep_findings=False),
        not settings.disable_aggregation,
    )
    try:
        summary = await until_interrupted(work)
    except Interrupted:
        print_interrupted(files.output, "rollouts")
        return EXIT_INTERRUPTED
    _print_summary(files, summary, not settings.disable_aggregation)
    status = report_deaths(health, summary) if health is not None else None
    if status is None and summary.health.quarantined:
        _print_quarantined(summary)
        status = EXIT_FAILURE
    sent = summary.succeeded + summary.failed
    verdict = end_of_run(settings.max_failures, summary.failed, sent, summary.failures_by_class)
    return status if status is not None else verdict


def _print_quarantined(summary: RunSummary) -> None:
    err = console(stderr=True)
    for agent, why in summary.health.quarantined.items():
        err.print(f"[red]error:[/] environment '{escape(agent)}' was quarantined: {escape(why)}")
    err.print(
        f"{summary.failures_by_class.get(QUARANTINED, 0)} of its rollouts were not run ({QUARANTINED} in "
        "the failures file; --resume reruns them); the other environments finished. "
        "See gym eval health-check for the findings."
    )


def _print_summary(files: RunFiles, summary: RunSummary, aggregate: bool) -> None:
    if aggregate:
        _print_metrics(files)
    written = files.all() if aggregate else files.jsonl_files()
    done = f"{summary.succeeded} rollouts collected"
    print_counts(done, summary.skipped, summary.failed, summary.failures_by_class, written)
    if summary.failed:
        console().print(
            f"failed rollouts are listed in {files.failures}; rerun them with: {escape(resume_command())}"
        )


def _print_metrics(files: RunFiles) -> None:
    entries = orjson.loads(files.metrics.read_bytes())
    table = Table(title="per-environment metrics", title_justify="left")
    for column in ("agent", "rollouts", "failures", "mean reward", "pass@1", "p50 latency s"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    for entry in entries:
        m = entry["agent_metrics"]
        table.add_row(
            entry["agent_ref"]["name"],
            str(m.get("num_rollouts", 0)),
            str(m.get("num_failures", 0)),
            _num(m.get("mean/reward")),
            _num(m.get("pass@1")),
            _num(m.get("latency/p50_s")),
        )
    console().print(table)


def _num(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"
