"""``gym eval compare BASE CAND...``: per-environment deltas with intervals, flips, regressions.

NeMo Gym 0.7's flag names are accepted where they mean the same: ``--baseline``, ``--candidates``
(comma-separated), ``--output-dir``/``-o`` and ``--report-format`` (which writes
``compare_report.md`` / ``compare_report.json`` there).
"""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, console, fail
from polygym.collect import statistics as stats
from polygym.collect.compare import (
    DEFAULT_METRICS,
    DEFAULT_THRESHOLD,
    CandidateComparison,
    CompareError,
    Comparison,
    MetricDelta,
    TaskId,
    compare,
)
from polygym.row import env_label

STATUS_STYLE = {"ok": "green", "regression": "red", "missing": "red", "added": "cyan"}
REPORT_NAME = "compare_report"
MAX_FLIPS_SHOWN = 10


@click.command("compare")
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--baseline", type=click.Path(path_type=Path), help="The base run (instead of the first argument)."
)
@click.option(
    "--candidates", metavar="PATH[,PATH...]", help="Candidate runs, comma-separated (NeMo Gym's flag)."
)
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=DEFAULT_THRESHOLD,
    show_default=True,
    help="A regression is a drop whose whole interval lies below -THRESHOLD (absolute).",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="PATTERN",
    help=f"Metrics to compare, '*' globs allowed (repeatable) [default: {', '.join(DEFAULT_METRICS)}].",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=stats.DEFAULT_CONFIDENCE,
    show_default=True,
    help="Confidence level of the intervals.",
)
@click.option(
    "--bootstrap",
    "resamples",
    type=click.IntRange(min=1),
    default=stats.DEFAULT_RESAMPLES,
    show_default=True,
    help="Paired bootstrap resamples.",
)
@click.option("--seed", type=int, default=stats.DEFAULT_SEED, show_default=True, help="Bootstrap seed.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "json"]),
    default="table",
    show_default=True,
    help="What to print.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--output-dir", "-o", type=click.Path(path_type=Path), help=f"Also write {REPORT_NAME}.md/.json here."
)
@click.option(
    "--report-format",
    type=click.Choice(["md", "json", "both"]),
    default="both",
    show_default=True,
    help="Which reports --output-dir gets.",
)
@click.option(
    "--agent", "agents", multiple=True, metavar="NAME", help="Compare only this environment (repeatable)."
)
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when any environment regressed.")
def compare_command(
    runs: tuple[Path, ...],
    baseline: Path | None,
    candidates: str | None,
    threshold: float,
    metrics: tuple[str, ...],
    confidence: float,
    resamples: int,
    seed: int,
    fmt: str,
    as_json: bool,
    output_dir: Path | None,
    report_format: str,
    agents: tuple[str, ...],
    fail_on_regression: bool,
) -> None:
    """Compare a base run with candidate runs, environment by environment.

    A run is an _aggregate_metrics.json, its rollouts .jsonl, or a folder of them. With the
    rollouts, each delta has a confidence interval (paired bootstrap over tasks, Welch when the
    runs share no task) and the tasks that flipped are listed; with only metrics, point deltas.

    \b
      gym eval compare results/base.jsonl results/new.jsonl
      gym eval compare runs/step_0/ runs/step_1000/ runs/step_2000/ --format md
      gym eval compare --baseline a.jsonl --candidates b.jsonl,c.jsonl --fail-on-regression
    """
    paths = list(runs)
    if baseline is not None:
        paths.insert(0, baseline)
    if candidates:
        paths += [Path(p) for p in candidates.split(",") if p]
    if len(paths) < 2:
        fail(
            "give a base run and at least one candidate (BASE CAND... or --baseline/--candidates)", EXIT_USAGE
        )
    try:
        result = compare(
            paths[0], paths[1:], threshold, metrics or DEFAULT_METRICS, confidence, resamples, seed, agents
        )
    except CompareError as exc:
        fail(str(exc), EXIT_USAGE)
    if output_dir is not None:
        write_reports(result, output_dir, report_format)
    if as_json or fmt == "json":
        click.echo(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2))
    elif fmt == "md":
        click.echo(markdown(result))
    else:
        print_comparison(result)
    if fail_on_regression and result.regressions:
        raise SystemExit(EXIT_FAILURE)


def write_reports(result: Comparison, folder: Path, report_format: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if report_format in ("md", "both"):
        (folder / f"{REPORT_NAME}.md").write_text(markdown(result))
    if report_format in ("json", "both"):
        (folder / f"{REPORT_NAME}.json").write_bytes(
            orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2)
        )


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def _interval(m: MetricDelta) -> str:
    if m.low is None or m.high is None:
        return "no interval"
    return f"[{m.low:+.4f}, {m.high:+.4f}]"


def _status(env_status: str, m: MetricDelta) -> str:
    return "regression" if m.regression else env_status if env_status in ("missing", "added") else ""


def _flips_line(lost: list[TaskId], gained: list[TaskId]) -> str:
    def head(count: str, tasks: list[TaskId]) -> str:
        if not tasks:
            return f"0 {count}"
        shown = ", ".join(str(t) for t in tasks[:MAX_FLIPS_SHOWN])
        more = f", ... {len(tasks) - MAX_FLIPS_SHOWN} more" if len(tasks) > MAX_FLIPS_SHOWN else ""
        return f"{len(tasks)} {count} (tasks {shown}{more})"

    return f"{head('solved -> unsolved', lost)}; {head('unsolved -> solved', gained)}"


def env_notes(cand: CandidateComparison) -> list[str]:
    """Per environment: how many tasks were paired and which flipped, or why there is no interval."""
    out = []
    for env in cand.environments:
        if env.paired_tasks:
            out.append(
                f"{env.env}: {env.paired_tasks} paired tasks; flips: {_flips_line(env.lost, env.gained)}"
            )
        if env.note:
            out.append(f"{env.env}: {env.note}")
    return out


def _settings(result: Comparison) -> str:
    return (
        f"threshold {result.threshold:g}, {result.confidence:.0%} intervals, "
        f"{result.resamples} bootstrap resamples, seed {result.seed}"
    )


def markdown(result: Comparison) -> str:
    """The comparison as Markdown: one section per candidate, one table row per metric."""
    lines = [f"# Compare against `{result.base}`", "", _settings(result), ""]
    for cand in result.candidates:
        lines += _candidate_markdown(cand)
    regressions = result.regressions
    lines.append(
        f"**{len(regressions)} regression{'s' if len(regressions) != 1 else ''}**"
        if regressions
        else "**no regressions**"
    )
    lines += [f"- {line}" for line in regressions]
    return "\n".join(lines) + "\n"


def _candidate_markdown(cand: CandidateComparison) -> list[str]:
    lines = [
        f"## `{cand.new}`",
        "",
        "| environment | metric | base | new | delta | interval | method | status |",
        "|---|---|--:|--:|--:|---|---|---|",
    ]
    for env in cand.environments:
        for m in env.metrics:
            lines.append(
                f"| {env_label(env.env)} | {m.metric} | {_num(m.base)} | {_num(m.new)} "
                f"| {_num(m.delta, True)} | {_interval(m)} | {m.method} | {_status(env.status, m)} |"
            )
    lines.append("")
    lines += [f"- {line}" for line in env_notes(cand)]
    return [*lines, ""]


def print_comparison(result: Comparison) -> None:
    out = console()
    for cand in result.candidates:
        table = Table(
            title=f"{escape(result.base)} -> {escape(cand.new)} ({_settings(result)})", title_justify="left"
        )
        for column in ("environment", "metric", "base", "new", "delta", "interval", "status"):
            table.add_column(
                column, justify="left" if column in ("environment", "metric", "status") else "right"
            )
        for env in cand.environments:
            style = STATUS_STYLE.get(env.status, "")
            if not env.metrics:
                table.add_row(
                    escape(env_label(env.env)), "-", "-", "-", "-", "-", f"[{style}]{env.status}[/]"
                )
            for i, m in enumerate(env.metrics):
                status = _status(env.status, m)
                table.add_row(
                    escape(env_label(env.env)) if i == 0 else "",
                    escape(m.metric),
                    _num(m.base),
                    _num(m.new),
                    _num(m.delta, signed=True),
                    _interval(m),
                    f"[{STATUS_STYLE.get(status, '')}]{status}[/]" if status else "",
                )
            table.add_section()
        out.print(table)
        for line in env_notes(cand):
            out.print(escape(line))
    regressions = result.regressions
    if regressions:
        out.print(f"[red]{len(regressions)} regression{'s' if len(regressions) != 1 else ''}:[/]")
        for line in regressions:
            out.print(f"  {escape(line)}")
    else:
        out.print("[green]no regressions[/]")
