"""Authoring commands: ``gym env init``, ``gym env check`` and ``gym list environments``."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.authoring import check as envcheck
from polygym.authoring import scaffold
from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, SuggestingGroup, console, fail
from polygym.event_loop import run_async
from polygym.kinds import RESOURCES_KIND
from polygym.stack import catalog
from polygym.stack.config import ConfigError

STATUS_STYLE = {
    envcheck.PASS: "[green]PASS[/]",
    envcheck.FAIL: "[bold red]FAIL[/]",
    envcheck.WARN: "[yellow]WARN[/]",
    envcheck.SKIP: "[dim]SKIP[/]",
}


@click.group("list", cls=SuggestingGroup)
def list_group() -> None:
    """List what this installation offers."""


@click.command("init")
@click.argument("name")
@click.option(
    "--dir",
    "base_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder that holds (or will hold) resources_servers/ [default: the working directory].",
)
def init(name: str, base_dir: Path | None) -> None:
    """Create resources_servers/NAME/, a working environment to adapt.

    \b
    It has one tool, a verifier, a seeded dataset generator with its 5-row output, tests and a
    README; `gym env check NAME` and its tests pass as generated.
    """
    try:
        scaffold.check_name(name)
        target = scaffold.create_environment(name, base_dir)
    except scaffold.ScaffoldError as exc:
        fail(str(exc), EXIT_USAGE if "invalid environment name" in str(exc) else EXIT_FAILURE)
    out = console()
    out.print(f"[green]created[/] {escape(str(target))}")
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        out.print(f"  {escape(str(path.relative_to(target)))}")
    base = target.parent.parent
    steps = [
        f"gym env check {name}",
        f"pytest resources_servers/{name}/tests",
        f"gym eval run --model-type scripted_model --resources-server {name} "
        f"--input resources_servers/{name}/data/example.jsonl --output results/{name}.jsonl",
    ]
    if base.resolve() != Path.cwd().resolve():
        steps.insert(0, f"cd {shlex.quote(os.path.relpath(base))}")
    shadowed = catalog.project_root() / RESOURCES_KIND / name
    if shadowed.is_dir() and shadowed.resolve() != target.resolve():
        out.print(f"[yellow]note:[/] this folder shadows the shipped environment {name} when run from {base}")
    out.print("next:")
    for step in steps:
        out.print(f"  {escape(step)}")


@click.command("check")
@click.argument("name", metavar="NAME|PATH")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.01),
    default=envcheck.DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds each call to the environment may take (a hang fails the check).",
)
@click.option(
    "--rows",
    "max_rows",
    type=click.IntRange(min=1),
    default=envcheck.DEFAULT_MAX_ROWS,
    show_default=True,
    help="Dataset rows to verify rollouts on.",
)
def check(name: str, as_json: bool, timeout_s: float, max_rows: int) -> None:
    """Check an environment against the resources-server contract (exit 1 on a failure).

    \b
    Starts the environment's resources server alone on a loopback socket and checks: liveness,
    tool schemas, a call with schema-valid arguments per tool, 4xx (never 5xx) on malformed input,
    verify rewards finite and inside reward_range for wrong rollouts and for the class's
    example_solution (which must beat them), deterministic verify, sessions released, and that
    nothing hangs past --timeout.
    """
    try:
        envcheck.resolve_env_dir(name)
    except ConfigError as exc:
        fail("; ".join(exc.problems), exc.exit_code)
    report = run_async(envcheck.check_env_async(name, timeout_s=timeout_s, max_rows=max_rows))
    if as_json:
        click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(report)
    sys.exit(0 if report.ok else EXIT_FAILURE)


def print_report(report: envcheck.EnvReport) -> None:
    out = console()
    table = Table(title=f"gym env check {report.env}", title_justify="left", caption_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("details", overflow="fold")
    for result in report.results:
        table.add_row(
            escape(result.name), STATUS_STYLE.get(result.status, result.status), escape(result.detail)
        )
    counts = report.counts()
    table.caption = (
        f"{report.config}\n{counts['pass']} passed, {counts['fail']} failed, {counts['warn']} warnings, "
        f"{counts['skip']} skipped in {report.seconds:.2f}s"
    )
    out.print(table)
    verdict = "[green]ok[/]" if report.ok else "[bold red]FAILED[/]"
    out.print(f"{escape(report.env)}: {verdict}")


@list_group.command("environments")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def environments(as_json: bool) -> None:
    """Environments found here and shipped: domain, tools, datasets, description."""
    infos = [envcheck.describe_environment(name) for name in catalog.list_implementations(RESOURCES_KIND)]
    if as_json:
        click.echo(orjson.dumps(infos, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(title="environments", title_justify="left")
    for column in ("name", "domain", "tools", "datasets", "description"):
        table.add_column(column, overflow="fold")
    for info in infos:
        description = escape(info["description"])
        if info.get("error"):
            description = f"[red]error: {escape(info['error'])}[/]"
        table.add_row(
            escape(info["name"]),
            escape(info["domain"]),
            escape(", ".join(info["tools"])),
            escape(", ".join(_dataset_label(d) for d in info["datasets"])),
            description,
        )
    console().print(table)


def _dataset_label(dataset: dict[str, Any]) -> str:
    name, kind = dataset.get("name") or "?", dataset.get("type")
    return name if kind in (None, name) else f"{name} ({kind})"


ENV_COMMANDS: list[click.Command] = [init, check]
