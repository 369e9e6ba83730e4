"""The last line of every command that runs rollouts under ``--max-failures N|N%``.

The rule itself (parsing, what is allowed, the line's words) and the option's declaration
(``MAX_FAILURES``, a settings field's metadata) are ``polygym.collect.failure_budget``; this is its
printing, shared by ``gym eval run``, its ``--blend`` runs and ``gym eval reverify`` (and open to
``gym train run``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.markup import escape

from polygym.cli.base import EXIT_FAILURE, console
from polygym.collect.failure_budget import FailureBudget


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
