"""``gym train watch``: validation curves and regression alarms beside another trainer.

The command line of ``polygym.training.watch`` (what it evaluates, when, and what it writes is
documented there and in docs/trainers.md). Exit status: 0 when the watch ended with no alarm, 1
when an alarm fired (at once with ``--on-alarm exit``, at the end with ``continue``) or the
baseline could not be scored, 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from polygym.blend.spec import BlendSpecError
from polygym.cli.base import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, console, fail
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.train import parse_max_regressions
from polygym.collect.dataset import DatasetError
from polygym.event_loop import run_async
from polygym.net.client import ServerCallError
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError
from polygym.training.watch import WatchResult, WatchSettings, watch


@click.command("watch")
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--policy-url", required=True, help="The trainer's OpenAI-compatible base URL (http://host:8000/v1)."
)
@click.option("--policy-model", required=True, help="The model name the policy endpoint serves.")
@click.option("--policy-api-key", default="", help="API key of the policy endpoint, if it wants one.")
@click.option(
    "--output", "-o", "output", required=True, type=click.Path(path_type=Path), help="Folder to write."
)
@click.option(
    "--checkpoints",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Evaluate when a new entry appears in this folder (labelled with the last number in its name).",
)
@click.option(
    "--every-minutes",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Also evaluate every N minutes.",
)
@click.option(
    "--max-regression",
    "max_regressions",
    multiple=True,
    metavar="ENV=DELTA",
    help="As gym train run's (repeatable).",
)
@click.option(
    "--on-alarm",
    type=click.Choice(["exit", "continue"]),
    default="exit",
    show_default=True,
    help="exit: stop at the first alarm.",
)
@click.option("--hook", default=None, help="Command run on an alarm, the alarms as JSON in POLYGYM_ALARMS.")
@click.option(
    "--max-evaluations",
    type=click.IntRange(min=0),
    default=None,
    help="Stop after N evaluations past the baseline.",
)
@click.option(
    "--validation-limit", type=click.IntRange(min=1), default=None, help="Validation rows per environment."
)
@click.option("--max-output-tokens", type=click.IntRange(min=1), default=None, help="Per request.")
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--config", "configs", multiple=True, help="More stack config files (repeatable).")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def watch_command(
    spec_path: Path,
    policy_url: str,
    policy_model: str,
    policy_api_key: str,
    output: Path,
    checkpoints: Path | None,
    every_minutes: float | None,
    max_regressions: tuple[str, ...],
    on_alarm: str,
    hook: str | None,
    max_evaluations: int | None,
    validation_limit: int | None,
    max_output_tokens: int | None,
    concurrency: int,
    configs: tuple[str, ...],
    overrides: tuple[str, ...],
) -> None:
    """Watch SPEC's environments against a running trainer's policy endpoint.

    Evaluates every environment's validation rows at the start, then on each new checkpoint entry,
    SIGUSR1 or --every-minutes; applies gym train run's --max-regression rule against the start;
    writes validation.jsonl, validation_before.jsonl and validation/step_N.jsonl.

    \b
      gym train watch blend.yaml --policy-url http://127.0.0.1:8000/v1 --policy-model policy \\
          -o watch --checkpoints results/checkpoints --max-regression mcqa=0.05
    """
    if checkpoints is None and every_minutes is None:
        fail("give --checkpoints DIR or --every-minutes N (SIGUSR1 also triggers an evaluation)", EXIT_USAGE)
    settings = WatchSettings(
        spec_path=spec_path,
        output_dir=output,
        policy_url=policy_url,
        policy_model=policy_model,
        policy_api_key=policy_api_key,
        checkpoints=checkpoints,
        every_s=every_minutes * 60 if every_minutes is not None else None,
        max_regression=parse_max_regressions(max_regressions),
        on_alarm="exit" if on_alarm == "exit" else "continue",
        hook=hook,
        max_evaluations=max_evaluations,
        validation_limit=validation_limit,
        max_output_tokens=max_output_tokens,
        concurrency=concurrency,
        configs=configs,
        overrides=overrides,
    )
    out = console()
    try:
        result: WatchResult = run_async(until_interrupted(watch(settings, lambda s: out.print(escape(s)))))
    except Interrupted:
        fail("interrupted", EXIT_INTERRUPTED)
    except (BlendSpecError, DatasetError, ConfigError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    except (LaunchError, ServerCallError, RuntimeError) as exc:
        fail(str(exc), EXIT_FAILURE)
    if result.alarms:
        fail(f"{len(result.alarms)} alarm(s); see {output / 'alarms.jsonl'}", EXIT_FAILURE)
    out.print(f"watched {len(result.evaluations)} evaluation(s), no alarm; files in {escape(str(output))}")
