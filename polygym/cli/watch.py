"""``gym train watch``: validation curves and regression alarms beside another trainer.

The command line of ``polygym.training.watch`` (what it evaluates, when, and what it writes is
documented there and in docs/trainers.md). Exit status: 0 when the watch ended with no alarm, 1
when an alarm fired (at once with ``--on-alarm exit``, at the end with ``continue``) or the
baseline could not be scored, 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape

from polygym.blend.spec import BlendSpecError
from polygym.cli.base import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, console, fail
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.settings_options import settings_from, settings_options
from polygym.cli.train import parse_max_regressions
from polygym.collect.dataset import DatasetError
from polygym.event_loop import run_async
from polygym.net.client import ServerCallError
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError
from polygym.training.watch import WatchResult, WatchSettings, watch


@click.command("watch")
@settings_options(WatchSettings)
def watch_command(**values: Any) -> None:
    """Watch SPEC's environments against a running trainer's policy endpoint.

    Evaluates every environment's validation rows at the start, then on each new checkpoint entry,
    SIGUSR1 or --every-minutes; applies gym train run's --max-regression rule against the start;
    writes validation.jsonl, validation_before.jsonl and validation/step_N.jsonl.

    \b
      gym train watch blend.yaml --policy-url http://127.0.0.1:8000/v1 --policy-model policy \\
          -o watch --checkpoints results/checkpoints --max-regression mcqa=0.05
    """
    settings = settings_from(
        WatchSettings, values, max_regression=parse_max_regressions(values["max_regression"])
    )
    if settings.checkpoints is None and settings.every_minutes is None:
        fail("give --checkpoints DIR or --every-minutes N (SIGUSR1 also triggers an evaluation)", EXIT_USAGE)
    if settings.checkpoints is not None and settings.checkpoints.is_file():
        fail(f"--checkpoints {settings.checkpoints}: is a file, not a folder", EXIT_USAGE)
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
        fail(f"{len(result.alarms)} alarm(s); see {settings.output_dir / 'alarms.jsonl'}", EXIT_FAILURE)
    where = escape(str(settings.output_dir))
    out.print(f"watched {len(result.evaluations)} evaluation(s), no alarm; files in {where}")
