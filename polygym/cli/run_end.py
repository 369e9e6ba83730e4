"""How every command that runs rollouts ends on the terminal: the counts of what it did, the
message of an interrupted run or of one that could not run its stack, and the last line under
``--max-failures N|N%``.

Shared by ``gym eval run``, its ``--blend`` runs and ``gym eval reverify`` (and open to ``gym train
run``), so the commands word their ends alike. The ``--max-failures`` rule itself (parsing, what is
allowed, the line's words) and the option's declaration are ``polygym.collect.failure_budget``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rich.markup import escape

from polygym.cli.base import EXIT_FAILURE, EXIT_USAGE, console
from polygym.collect.failure_budget import FailureBudget
from polygym.collect.run_files import RunFileError, done_keys
from polygym.errors import ConfigError
from polygym.net.client import ServerCallError
from polygym.redact import redact_argv
from polygym.stack.backend import LaunchError

MASKED_NOTE = "(secret values masked: pass them again)"


def resume_command(argv: Sequence[str] | None = None) -> str:
    """The command that finishes this run, safe to print: secret option values are masked, and the
    hint says so, since a masked value must be typed again for the command to work."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--resume", "--overwrite")]
    shown = redact_argv(words)
    command = shlex.join(["gym", *shown, "--resume"])
    return f"{command} {MASKED_NOTE}" if shown != words else command


def end_of_run(
    budget: FailureBudget, failed: int, sent: int, by_class: Mapping[str, int], what: str = "rollouts"
) -> int:
    """Print the run's last line (how many failed, by class, and whether ``budget`` allows it) and
    return its exit code: 0 when allowed, 1 when not."""
    verdict = budget.verdict(failed, sent, by_class, what)
    if verdict.ok:
        console().print(escape(verdict.line))
        return 0
    console(stderr=True).print("[red]error:[/]", escape(verdict.line))
    return EXIT_FAILURE


def print_counts(
    done: str, skipped: int, failed: int, by_class: Mapping[str, int], files: Iterable[Path], also: str = ""
) -> None:
    """The run's counts: ``done`` (``"8 rollouts collected"``), then what was already done and what
    failed, by class; ``also`` (ending in ". ") comes before the files written."""
    classes = ", ".join(f"{name}: {count}" for name, count in by_class.items())
    line = f"{done}, {skipped} already done, {failed} failed" + (f" ({classes})" if classes else "")
    console().print(escape(f"{line}. {also}Files: {', '.join(str(p) for p in files)}"))


def print_interrupted(output: Path, what: str) -> None:
    """What an interrupted run saved (``what``: rollouts, rows) and the command that finishes it."""
    err = console(stderr=True)
    err.print(f"[yellow]interrupted:[/] {len(done_keys(output))} {what} are saved in {escape(str(output))}.")
    err.print("resume with:", escape(resume_command()))


STACK_ERRORS = (LaunchError, ConfigError, RunFileError, ServerCallError)
"""What stops a run before or while it talks to its stack (``stack_error`` words each)."""


def stack_error(exc: Exception) -> int:
    """Print why the run could not start, join or reach its stack; the exit code: 2 for a config
    or run-file problem the user can fix, else 1."""
    why = f"cannot reach the stack: {exc}" if isinstance(exc, ServerCallError) else str(exc)
    console(stderr=True).print("[red]error:[/]", escape(why))
    return EXIT_USAGE if isinstance(exc, RunFileError | ConfigError) else EXIT_FAILURE
