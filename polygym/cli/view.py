"""``gym view PATH [PATH ...]``: a local, read-only web page over runs; ``--export`` writes one HTML file."""

from __future__ import annotations

from pathlib import Path

import click

from polygym.cli.base import EXIT_INTERRUPTED, EXIT_USAGE, fail
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.event_loop import run_async


@click.command("view")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: any free port.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one self-contained HTML report (works offline) instead of serving.",
)
def view(paths: tuple[Path, ...], port: int, export_path: Path | None) -> None:
    """Look at runs in a browser: overview, steps, rollouts, and a comparison of the first two.

    \b
    PATH is the --output .jsonl of `gym eval run` (or any sibling file of it), a step-wise run,
    or a `gym train run` folder. The server listens on 127.0.0.1 only and prints its URL.
      gym view runs/demo.jsonl
      gym view runs/base.jsonl runs/new.jsonl          # Compare: base -> new
      gym view runs/demo.jsonl --export report.html
    """
    try:
        from polygym.view.export import write_export
        from polygym.view.runs import RunNotFoundError
        from polygym.view.viewer import find_runs, open_runs, serve
    except ImportError as exc:
        fail(
            f"gym view needs the [view] extra ({exc.name} is missing): pip install 'polygym[view]'",
            EXIT_USAGE,
        )
    if export_path is not None and port:
        fail("--port and --export cannot be used together (an export serves nothing)", EXIT_USAGE)
    try:
        if export_path is not None:
            indexes = open_runs(paths, echo=lambda line: click.echo(line, err=True))
        else:
            indexes = find_runs(paths)  # read after the URL is printed, page by page
    except RunNotFoundError as exc:
        fail(str(exc), EXIT_USAGE)
    if export_path is not None:
        size = write_export(indexes, export_path)
        click.echo(f"wrote {export_path} ({size / 1e3:.0f} KB, self-contained)")
        return
    try:
        run_async(until_interrupted(serve(indexes, port, echo=lambda line: click.echo(line))))
    except (Interrupted, KeyboardInterrupt):
        click.echo("gym view: stopped", err=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
