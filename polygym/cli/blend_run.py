"""``gym eval run --blend SPEC --steps N``: collect a blend's rollouts step by step.

The helpers shared with ``gym train plan`` (``load_spec_or_exit``) and the runner that ``gym eval run``
calls with ``--blend`` live here, so the eval command does not reach into the training command.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.markup import escape

from polygym.blend.mix import load_blend
from polygym.blend.planner import InfeasiblePlanError
from polygym.blend.spec import BlendSpec, BlendSpecError, load_spec
from polygym.blend.stepwise import StepFiles, StepReport, StepSettings, environments_to_serve, run_steps
from polygym.cli.base import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, console, fail, load_stack_config
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.run_end import end_of_run
from polygym.collect.dataset import DatasetError
from polygym.collect.failure_budget import NO_FAILURES, FailureBudget
from polygym.collect.run_files import RunFileError
from polygym.jsonl import iter_jsonl
from polygym.net.client import ServerCallError
from polygym.row import STEP_FIELD
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError, StackConfig
from polygym.stack.session import StackSession, StackTarget


def load_spec_or_exit(path: Path) -> BlendSpec:
    try:
        return load_spec(path)
    except BlendSpecError as exc:
        fail(str(exc), EXIT_USAGE)


def blend_stack_config(
    spec: BlendSpec,
    resources_servers: tuple[str, ...] = (),
    model_types: tuple[str, ...] = (),
    configs: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
) -> StackConfig:
    """The stack for a blend: the spec's environments plus any selectors given, exiting on errors."""
    names = tuple(dict.fromkeys((*environments_to_serve(spec), *resources_servers)))
    return load_stack_config(names, model_types, configs, overrides)


def print_step(report: StepReport) -> None:
    """One line per finished step: shares and rewards per environment, stragglers if any."""
    parts = []
    for env in report.envs.values():
        reward = f"{env.reward_mean:.3f}" if env.reward_mean is not None else "-"
        extra = f" stragglers {env.stragglers}" if env.stragglers else ""
        extra += f" failed {env.failures}" if env.failures else ""
        parts.append(f"{env.env} {env.realized_share:.0%}/{env.target_share:.0%} reward {reward}{extra}")
    flag = " [yellow](deadline)[/]" if report.timed_out else ""
    console().print(f"step {report.step}{flag} {report.elapsed_s:.1f}s: " + escape("; ".join(parts)))


async def run_blend(
    spec: BlendSpec,
    target: StackTarget,
    output: Path,
    settings: StepSettings,
    overwrite: bool = False,
    max_failures: FailureBudget = NO_FAILURES,
) -> int:
    """Collect ``settings.steps`` steps of ``spec`` on the stack ``target`` starts or joins, print
    a line per step, and return the exit code: 2 bad input, 1 stack trouble or more failed
    rollouts (stragglers included) than ``max_failures`` allows, 130 Ctrl-C."""
    err = console(stderr=True)
    try:
        blend = load_blend(spec)
        blend.plan()
    except (BlendSpecError, DatasetError, InfeasiblePlanError) as exc:
        err.print("[red]error:[/]", escape(str(exc)))
        return EXIT_USAGE
    try:
        async with StackSession(target, settings.limits.concurrency) as session:
            session.require_agents({f"environment {env.name}": env.agent for env in blend.environments})
            client = await session.connect()
            reports = await until_interrupted(
                run_steps(client, blend, output, settings, overwrite, print_step)
            )
    except Interrupted:
        resume_at = next_step(output, settings.start_step)
        err.print(
            f"[yellow]interrupted:[/] steps {settings.start_step}..{resume_at - 1} are complete in "
            f"{escape(str(output))}; continue with --start-step {resume_at}"
        )
        return EXIT_INTERRUPTED
    except (ValueError, RunFileError, ConfigError) as exc:
        err.print("[red]error:[/]", escape(str(exc)))
        return EXIT_USAGE
    except (LaunchError, ServerCallError) as exc:
        err.print("[red]error:[/]", escape(str(exc)))
        return EXIT_FAILURE
    failed, sent = _print_collected(reports, output, settings)
    by_class = _failure_classes(StepFiles(output), {r.step for r in reports})
    return end_of_run(max_failures, failed, sent, by_class)


def next_step(output: Path, start: int = 0) -> int:
    """The first step not yet finished in ``output``'s steps file (``start`` when there is none)."""
    finished = [line.get("step") for line in iter_jsonl(StepFiles(output).steps)]
    return max([start - 1, *(s for s in finished if isinstance(s, int))]) + 1


def _print_collected(reports: list[StepReport], output: Path, settings: StepSettings) -> tuple[int, int]:
    """Print the run's totals; returns the rollouts that failed or straggled, and those sent."""
    stragglers = sum(r.total.stragglers for r in reports)
    failures = sum(r.total.failures for r in reports)
    start, files = settings.start_step, StepFiles(output)
    console().print(
        f"{len(reports)} steps ({start}..{start + settings.steps - 1}) collected: "
        f"{sum(r.total.completed for r in reports)} rollouts, {failures} failed, {stragglers} stragglers. "
        f"Files: {', '.join(str(p) for p in files.all())}"
    )
    completed = sum(r.total.completed for r in reports)
    return failures + stragglers, completed + failures + stragglers


def _failure_classes(files: StepFiles, steps: set[int]) -> Counter[str]:
    """Failed rollouts of ``steps`` by class (``Straggler`` included), read back from the failures file."""
    return Counter(
        str(f.get("error_class")) for f in iter_jsonl(files.failures) if f.get(STEP_FIELD) in steps
    )
