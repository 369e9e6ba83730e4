"""``gym env prune``: remove the NeMo Gym environments not used lately from polygym's cache."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape

from polygym.cli.base import EXIT_USAGE, console, fail
from polygym.cli.settings_options import settings_from, settings_options
from polygym.stack.env_build import CACHE_ENV_VAR, cache_root
from polygym.stack.env_cache import PruneReport, PruneSettings, configured_max_size, format_size, prune


@click.command("prune")
@settings_options(PruneSettings)
def prune_command(**values: Any) -> None:
    """Remove cached NeMo Gym environments, least recently used first; never one in use.

    \b
    Each environment is ~1.4 GB. Builds keep the cache within POLYGYM_ENV_CACHE_MAX_SIZE on their
    own; this removes more on demand. An environment a stack runs, or being built, stays.
    Example (see what would go, then keep the 5 most recently used):
      gym env prune --keep-last 5 --dry-run
      gym env prune --keep-last 5
    """
    settings = settings_from(PruneSettings, values)
    max_size = settings.max_size
    if max_size is None and settings.keep_last is None:
        try:
            max_size = configured_max_size()
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
    report = prune(cache_root(), settings.keep_last, max_size, settings.dry_run)
    _print(report, settings.dry_run)


def _print(report: PruneReport, dry_run: bool) -> None:
    """Every environment of the cache, least recently used first, with what became of it."""
    out = console()
    count = len(report.found)
    out.print(
        escape(f"{report.root} ({CACHE_ENV_VAR}): {count} environments, {format_size(report.size_before)}")
    )
    verb = "would remove" if dry_run else "removed"
    why_kept = {env.path: reason for env, reason in report.kept}
    gone = {env.path for env in report.removed}
    for env in report.found:
        if env.path in gone:
            out.print(escape(f"{verb} {env.describe()}"))
        else:
            reason = why_kept.get(env.path)
            out.print(escape(f"kept {env.describe()}" + (f": {reason}" if reason else "")))
    left = report.size_before - report.freed
    freed = "would free" if dry_run else "freed"
    out.print(
        escape(
            f"{verb} {len(report.removed)} of {count}, {freed} {format_size(report.freed)} "
            f"({report.freed} bytes); {format_size(left)} left"
        )
    )
