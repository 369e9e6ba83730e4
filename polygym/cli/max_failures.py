"""``--max-failures N|N%`` on every command that runs rollouts, and the last line each run ends with.

The rule itself (parsing, what is allowed, the line's words) is ``polygym.collect.failure_budget``;
this is its click option and its printing, shared by ``gym eval run``, its ``--blend`` runs and
``gym eval reverify`` (and open to ``gym train run``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
from rich.markup import escape

from polygym.cli.base import EXIT_FAILURE, console
from polygym.collect.failure_budget import MAX_FAILURES_HELP, NO_FAILURES, FailureBudget, FailureBudgetError

F = TypeVar("F", bound=Callable[..., Any])


class FailureBudgetType(click.ParamType):
    """``--max-failures N|N%`` parsed by ``FailureBudget.parse`` (exit 2 naming the option when bad)."""

    name = "N|N%"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> FailureBudget:
        if isinstance(value, FailureBudget):
            return value
        try:
            return FailureBudget.parse(str(value))
        except FailureBudgetError as exc:
            self.fail(str(exc), param, ctx)


def max_failures_option(func: F) -> F:
    """``--max-failures``: the same option, parsed the same way, on every command that runs rollouts."""
    return click.option(
        "--max-failures",
        type=FailureBudgetType(),
        default=NO_FAILURES.text,
        show_default=True,
        help=MAX_FAILURES_HELP,
    )(func)


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
