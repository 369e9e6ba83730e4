"""``gym eval reverify``: recompute the rewards of stored rollouts through their environments."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import EXIT_INTERRUPTED, console, selector_options
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.placement_options import refuse_when_joining
from polygym.cli.run_end import STACK_ERRORS, end_of_run, print_counts, print_interrupted, stack_error
from polygym.cli.run_options import stack_options, stack_target
from polygym.cli.settings_options import settings_from, settings_options
from polygym.collect.reverify import (
    OUTCOMES,
    ReverifySettings,
    ReverifySummary,
    diff_path,
    reverify,
)
from polygym.collect.run_files import RunFiles
from polygym.event_loop import run_async
from polygym.row import ALL_ENVS, env_label
from polygym.stack.session import StackSession, StackTarget


@click.command("reverify")
@selector_options
@settings_options(ReverifySettings)
@stack_options
@click.pass_context
def reverify_command(ctx: click.Context, **opts: Any) -> None:
    """Recompute the rewards of stored rollouts through their environments' /verify, into new files.

    \b
    gym eval reverify --model-type scripted_model --resources-server mcqa --rollouts results/out.jsonl
    writes results/out_reverified.jsonl (+ _failures, _aggregate_metrics) and results/out_reverify_diff.json;
    results/out.jsonl and its files are never changed.
    """
    settings = settings_from(ReverifySettings, opts)
    refuse_when_joining(ctx, opts)
    sys.exit(run_async(_reverify(stack_target(opts), settings)))


async def _reverify(target: StackTarget, settings: ReverifySettings) -> int:
    try:
        files = settings.files()
        async with StackSession(target, settings.concurrency) as session:
            client = await session.connect()
            summary = await until_interrupted(reverify(client, settings))
    except Interrupted:
        print_interrupted(files.output, "rows")
        return EXIT_INTERRUPTED
    except STACK_ERRORS as exc:
        return stack_error(exc)
    _print_diff(files, summary)
    unreadable = summary.unreadable
    failed = summary.failed + sum(unreadable.values())
    by_class = summary.failures_by_class + unreadable
    return end_of_run(settings.max_failures, failed, summary.verified + failed, by_class, "rows")


def _print_diff(files: RunFiles, summary: ReverifySummary) -> None:
    out = console()
    table = Table(title="reverified rewards", title_justify="left")
    table.add_column("agent")
    for column in OUTCOMES:
        table.add_column(column.replace("_", " "), justify="right")
    for env in sorted(summary.diff, key=lambda env: (env == ALL_ENVS, env)):  # the roll-up last
        table.add_row(env_label(env), *(str(summary.diff[env][name]) for name in OUTCOMES))
    out.print(table)
    total = summary.diff.get(ALL_ENVS, {})
    changed = total.get("raised", 0) + total.get("lowered", 0)
    done = f"{changed} rewards changed; {summary.verified} rows reverified"
    diff = f"Diff: {diff_path(files.output)}. "
    print_counts(done, summary.skipped, summary.failed, summary.failures_by_class, files.all(), diff)
    if summary.no_response:
        out.print(
            f"{summary.no_response} failed rows have no response to verify; "
            "rerun them with gym eval run --resume"
        )
    if summary.dropped:
        _print_dropped(summary)
    if summary.forced:
        out.print(f"[yellow]warning:[/] reverified with --force against {', '.join(summary.forced)}")


SHOWN_DROPPED = 10
"""Dropped lines named one by one; the rest are counted."""


def _print_dropped(summary: ReverifySummary) -> None:
    """Every line of the stored run that was not reverified, counted by why and named (the first
    ``SHOWN_DROPPED``): unreadable lines count as failed rows, a duplicate key is verified once."""
    err = console(stderr=True)
    kinds = Counter(d.kind for d in summary.dropped)
    counted = ", ".join(f"{kind}: {n}" for kind, n in kinds.most_common())
    err.print(f"[yellow]warning:[/] {len(summary.dropped)} lines were not reverified ({escape(counted)}):")
    for dropped in summary.dropped[:SHOWN_DROPPED]:
        err.print(f"  - {escape(str(dropped))}")
    if len(summary.dropped) > SHOWN_DROPPED:
        err.print(f"  ... and {len(summary.dropped) - SHOWN_DROPPED} more")
