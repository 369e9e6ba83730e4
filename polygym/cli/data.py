"""``gym data``: build and check datasets for several environments.

``gym data blend`` writes one JSONL for a blend of environments with ``agent_ref`` stamped on every
row (what users otherwise do with one ``jq`` command per environment), in concatenated, shuffled
or training-step order. ``gym data validate`` checks rows against the environments they target
before an hour of collection finds the typo.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import click
import orjson
from rich.markup import escape
from rich.table import Table

from polygym.blend.mix import ORDERS, load_blend
from polygym.blend.spec import BlendSpec, BlendSpecError, load_spec, spec_from_flags
from polygym.blend.validate import CHARS_PER_TOKEN, ValidationReport, validate_files
from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, SuggestingGroup, console, fail
from polygym.collect.dataset import DatasetError
from polygym.jsonl import iter_jsonl, write_jsonl


@click.group(cls=SuggestingGroup)
def data() -> None:
    """Blend and validate datasets across environments."""


def spec_from_options(
    spec_path: Path | None,
    envs: tuple[str, ...],
    prompts_per_step: int | None,
    seed: int | None,
) -> BlendSpec:
    """``--spec SPEC`` or ``--env NAME[=WEIGHT]...`` (exactly one form), exiting on problems."""
    if spec_path is not None and envs:
        fail("pass either --spec SPEC or --env NAME[=WEIGHT] flags, not both", EXIT_USAGE)
    if spec_path is None and not envs:
        fail("nothing to blend: pass --spec SPEC or one --env NAME[=WEIGHT] per environment", EXIT_USAGE)
    try:
        spec = load_spec(spec_path) if spec_path is not None else spec_from_flags(envs, prompts_per_step)
    except BlendSpecError as exc:
        fail(str(exc), exc.exit_code)
    updates: dict[str, Any] = {}
    if seed is not None:
        updates["seed"] = seed
    if prompts_per_step is not None:
        updates["prompts_per_step"] = prompts_per_step
    return spec.model_copy(update=updates) if updates else spec


@data.command("blend")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=None, help="Blend spec YAML.")
@click.option(
    "--env",
    "envs",
    multiple=True,
    metavar="NAME[=WEIGHT]",
    help="An environment and its weight (repeatable); reads the datasets its config lists.",
)
@click.option("--output", "output_path", required=True, type=click.Path(path_type=Path), help="JSONL.")
@click.option(
    "--order",
    type=click.Choice(ORDERS),
    default="concat",
    show_default=True,
    help="concat: environments in turn, rows in file order; shuffled: all rows shuffled by the seed; "
    "steps: rows in the sampler's training-step order.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="With --order steps: how many steps [default: until every row was used once].",
)
@click.option("--prompts-per-step", type=click.IntRange(min=1), default=None, help="Override the spec's.")
@click.option("--seed", type=int, default=None, help="Override the spec's seed.")
@click.option(
    "--split",
    type=click.Choice(["train", "validation"]),
    default="train",
    show_default=True,
    help="Which files of each environment to blend.",
)
def blend(**opts: Any) -> None:
    """Write one validated JSONL for a blend of environments, agent_ref on every row.

    \b
      gym data blend --env example_single_tool_call --env example_multi_step --output blend.jsonl
      gym data blend --spec blend.yaml --order steps --output steps.jsonl
    """
    if opts["order"] == "steps" and opts["envs"] and opts["prompts_per_step"] is None:
        fail("--order steps with --env flags needs --prompts-per-step N (or use a --spec)", EXIT_USAGE)
    if opts["steps"] is not None and opts["order"] != "steps":
        fail("--steps only applies to --order steps", EXIT_USAGE)
    spec = spec_from_options(opts["spec_path"], opts["envs"], opts["prompts_per_step"], opts["seed"])
    try:
        loaded = load_blend(spec, opts["split"])
        written = write_jsonl(loaded.ordered(opts["order"], opts["steps"]), opts["output_path"])
    except (BlendSpecError, DatasetError, ValueError) as exc:  # InfeasiblePlanError too
        fail(str(exc), EXIT_USAGE)
    counts = Counter(row["agent_ref"]["name"] for row in iter_jsonl(opts["output_path"]))
    out = console()
    table = Table(title=f"{escape(str(opts['output_path']))} ({opts['order']} order)", title_justify="left")
    for column in ("environment", "agent", "source rows", "rows written"):
        table.add_column(column, justify="left" if column in ("environment", "agent") else "right")
    for env in loaded.environments:
        table.add_row(env.name, env.agent, str(len(loaded.rows[env.name])), str(counts[env.agent]))
    out.print(table)
    out.print(f"{written} rows written to {escape(str(opts['output_path']))}")


@data.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--env",
    "envs",
    multiple=True,
    metavar="NAME",
    help="Check against these environments only (repeatable); with one, rows without agent_ref target it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def validate(files: tuple[Path, ...], envs: tuple[str, ...], as_json: bool) -> None:
    """Check dataset rows against the environments they target.

    Checks each row's shape, that its agent_ref names an agent some environment config defines,
    and that it has every field that environment's verifier requires (with the right types).
    Prints counts per environment; exits 1 when any row has a problem.
    """
    report = validate_files(list(files), list(envs))
    if as_json:
        payload = {
            "rows": report.rows,
            "problems": report.problems,
            "notes": report.notes,
            "environments": [s.to_dict() for s in report.stats],
            "token_estimate": f"characters / {CHARS_PER_TOKEN} of input and tools",
        }
        click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_validation(report)
    if report.problems:
        raise SystemExit(EXIT_FAILURE)


def _print_validation(report: ValidationReport) -> None:
    err = console(stderr=True)
    for problem in report.problems[:200]:  # one line each, however long: file:line: field: why
        err.print(escape(problem), soft_wrap=True)
    if len(report.problems) > 200:
        err.print(f"... and {len(report.problems) - 200} more")
    out = console()
    table = Table(title="rows per environment", title_justify="left")
    for column in ("environment", "agent", "rows", "tools", "turns min/mean/max", "~tokens mean/max"):
        table.add_column(column, justify="left" if column in ("environment", "agent", "tools") else "right")
    for stats in report.stats:
        d = stats.to_dict()
        turns, tokens = d["turns"], d["est_tokens"]
        tools = ", ".join(d["tools"]) if len(d["tools"]) <= 4 else f"{len(d['tools'])} tools"
        table.add_row(
            d["env"],
            d["agent"],
            str(d["rows"]),
            tools or "-",
            f"{turns['min']}/{turns['mean']:.1f}/{turns['max']}",
            f"{tokens['mean']:.0f}/{tokens['max']}",
        )
    out.print(table)
    out.print(f"tokens are estimated as characters / {CHARS_PER_TOKEN} of the input items and tools")
    for note in report.notes:
        out.print(f"note: {escape(note)}")
    problems = len(report.problems)
    verdict = (
        f"[red]{problems} problem{'s' if problems != 1 else ''}[/]" if problems else "[green]no problems[/]"
    )
    out.print(f"{report.rows} rows checked: {verdict}")
