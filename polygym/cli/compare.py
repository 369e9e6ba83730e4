"""``gym eval compare BASE NEW``: per-environment metric deltas between two runs, regressions flagged."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, console, fail
from polygym.collect.compare import DEFAULT_METRICS, DEFAULT_THRESHOLD, CompareError, Comparison, compare
from polygym.row import env_label

STATUS_STYLE = {"ok": "green", "regression": "red", "missing": "red", "added": "cyan"}


@click.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=DEFAULT_THRESHOLD,
    show_default=True,
    help="A drop larger than this (absolute) is a regression.",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="PATTERN",
    help=f"Metrics to compare, '*' globs allowed (repeatable) [default: {', '.join(DEFAULT_METRICS)}].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when any environment regressed.")
def compare_command(
    base: Path, new: Path, threshold: float, metrics: tuple[str, ...], as_json: bool, fail_on_regression: bool
) -> None:
    """Compare two runs' _aggregate_metrics.json (files or folders of them), environment by environment.

    \b
      gym eval compare results/base_aggregate_metrics.json results/new_aggregate_metrics.json
      gym eval compare runs/step_1000/ runs/step_2000/ --threshold 0.01 --fail-on-regression
    """
    try:
        result = compare(base, new, threshold, metrics or DEFAULT_METRICS)
    except CompareError as exc:
        fail(str(exc), EXIT_USAGE)
    if as_json:
        click.echo(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2))
    else:
        print_comparison(result)
    if fail_on_regression and result.regressions:
        raise SystemExit(EXIT_FAILURE)


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def print_comparison(result: Comparison) -> None:
    out = console()
    table = Table(
        title=f"{escape(result.base)} -> {escape(result.new)} (threshold {result.threshold:g})",
        title_justify="left",
    )
    for column in ("environment", "metric", "base", "new", "delta", "status"):
        table.add_column(column, justify="left" if column in ("environment", "metric", "status") else "right")
    for env in result.environments:
        style = STATUS_STYLE.get(env.status, "")
        if not env.metrics:
            table.add_row(escape(env_label(env.env)), "-", "-", "-", "-", f"[{style}]{env.status}[/]")
        for i, m in enumerate(env.metrics):
            status = (
                "regression" if m.regression else env.status if env.status in ("missing", "added") else ""
            )
            table.add_row(
                escape(env_label(env.env)) if i == 0 else "",
                escape(m.metric),
                _num(m.base),
                _num(m.new),
                _num(m.delta, signed=True),
                f"[{STATUS_STYLE.get(status, '')}]{status}[/]" if status else "",
            )
        table.add_section()
    out.print(table)
    regressions = result.regressions
    if regressions:
        out.print(f"[red]{len(regressions)} regression{'s' if len(regressions) != 1 else ''}:[/]")
        for line in regressions:
            out.print(f"  {escape(line)}")
    else:
        out.print("[green]no regressions[/]")
