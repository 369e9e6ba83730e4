"""Errors that report every problem found at once, each with the exit code the CLI uses for it.

A config, a dataset or a blend spec is checked completely before anything runs, so that one run
shows every fix the user has to make instead of one per attempt. These errors share one base that
holds the list, formats it the same way everywhere, and carries its exit code, so that the CLI
maps any of them to an exit status without knowing which it is.

This module imports nothing from polygym: every layer may raise these errors without importing
the layer that defines the others (``stack.catalog`` raises ``ConfigError`` without importing
``stack.config``, which imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

EXIT_USAGE = 2
"""The exit status for input the user must fix (a bad config, dataset or spec), as click uses it."""


class ProblemsError(Exception):
    """A list of problems (``problems``), all found in one pass; ``str()`` lists them, capped."""

    noun: ClassVar[str] = "problem"
    """What one problem is called in the header line (``3 config problems:``)."""
    exit_code: ClassVar[int] = EXIT_USAGE
    max_shown: ClassVar[int] = 50
    """A dataset can have a problem on every one of its million lines; a terminal needs the first few."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__(self.problems)  # keeps the error picklable across process backends

    def __str__(self) -> str:
        count = len(self.problems)
        shown = self.problems[: self.max_shown]
        more = [f"... and {count - len(shown)} more"] if count > len(shown) else []
        return "\n  - ".join([f"{count} {self.noun}{'s' if count != 1 else ''}:", *shown, *more])


class ConfigError(ProblemsError):
    """Every problem found in a configuration, reported together so one run shows all fixes needed."""

    noun = "config problem"


class DatasetError(ProblemsError):
    """Rows that cannot be used; ``problems`` lists ``file:line: field: problem`` lines."""

    noun = "invalid row problem"


class BlendSpecError(ProblemsError):
    """A spec that cannot be used; ``problems`` are ``file: key: problem`` lines."""

    noun = "blend spec problem"
