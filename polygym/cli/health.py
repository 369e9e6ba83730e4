"""``gym eval health-check RUN``: what in a finished run should not have counted, by environment."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, console, fail
from polygym.collect.health import HealthMonitor, check_run
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl

SHOWN_FINDINGS = 20


@click.command("health-check")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary and every finding as JSON.")
@click.option("--fail-on-findings", is_flag=True, help="Exit 1 when anything is found.")
def health_check_command(run: Path, as_json: bool, fail_on_findings: bool) -> None:
    """Find rollouts that say the run itself is unhealthy: a model never called, hollow turns,
    zero-token completions, generation cut at its token limit, tool arguments the tool's schema
    rejects, duplicated (task, repeat) rows, tasks no repeat passes or that failed every time.

    RUN is the --output JSONL of gym eval run; its _failures.jsonl is read too.

    \b
      gym eval health-check results/eval.jsonl
      gym eval health-check results/eval.jsonl --json --fail-on-findings
    """
    files = RunFiles(run)
    if run.is_dir() or not run.is_file():
        problem = "is a directory" if run.is_dir() else "no such file"
        fail(f"{run}: {problem}; give the run's --output JSONL", EXIT_USAGE)
    failures = iter_jsonl(files.failures) if files.failures.is_file() else iter([])
    monitor = check_run(iter_jsonl(run), failures)
    if as_json:
        findings = [f.to_dict() for f in monitor.findings]
        report = {"run": str(run), "environments": monitor.summary(), "findings": findings}
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    else:
        print_health(run, monitor)
    if fail_on_findings and monitor.findings:
        raise SystemExit(EXIT_FAILURE)


def print_health(run: Path, monitor: HealthMonitor) -> None:
    out = console()
    table = Table(title=f"health of {escape(str(run))}")
    for column in ("environment", "rollouts", "failures", "unhealthy", "findings"):
        table.add_column(column, justify="left" if column in ("environment", "findings") else "right")
    for env, entry in monitor.summary().items():
        unhealthy = f"{entry['unhealthy']} ({entry['unhealthy_rate']:.0%})"
        kinds = ", ".join(f"{kind} {n}" for kind, n in entry["findings"].items()) or "none"
        table.add_row(escape(env), str(entry["rollouts"]), str(entry["failures"]), unhealthy, kinds)
    out.print(table)
    if not monitor.findings:
        out.print("no findings")
        return
    for finding in monitor.findings[:SHOWN_FINDINGS]:
        repeat = "" if finding.rollout_index is None else f" repeat {finding.rollout_index}"
        where = f"task {finding.task_index}{repeat}"
        out.print(f"{escape(finding.env)}  {where}  {finding.kind}: {escape(finding.detail)}")
    if len(monitor.findings) > SHOWN_FINDINGS:
        out.print(f"... and {len(monitor.findings) - SHOWN_FINDINGS} more (--json lists them all)")
