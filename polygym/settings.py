"""Settings declared once: a dataclass field carries its command-line flag, help text and bounds.

A command's settings are one dataclass whose fields hold their defaults as usual; ``cli(...)`` is
the field's ``metadata``, saying how the setting appears on the command line, and
``polygym.cli.settings_options`` generates the click options from it. So a setting's name,
default and help are written in one place instead of three (option, parameter, field) that drift
apart. Plain data with no click in it, so the layers below the command line can declare settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

CLI_KEY = "polygym.cli"
"""The metadata key of a field's ``CliSpec``; a field without one has no command-line option."""


@dataclass(frozen=True)
class CliSpec:
    """How one setting appears on the command line (the type comes from the field's annotation)."""

    help: str
    flags: tuple[str, ...] = ()
    """Flags as written (``("--output", "-o")``); empty: ``--`` and the field name with dashes."""
    argument: bool = False
    """A positional argument instead of an option."""
    metavar: str | None = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    """``min`` itself is refused (seconds that must be more than zero)."""
    choices: tuple[str, ...] = ()
    multiple: bool = False
    """Repeatable; implied by a ``tuple[...]`` field."""
    required: bool = False
    parse: Callable[[str], object] | None = None
    """Turns the text into the field's value, raising ``ValueError`` (with the message to show) on a
    bad one: for a type of the project's own, such as ``--max-failures N|N%``."""


def cli(
    help: str,
    *flags: str,
    argument: bool = False,
    metavar: str | None = None,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    choices: tuple[str, ...] = (),
    multiple: bool = False,
    required: bool = False,
    parse: Callable[[str], object] | None = None,
) -> Mapping[str, CliSpec]:
    """A field's ``metadata`` declaring its option: ``field(default=24, metadata=cli("Steps.", min=1))``."""
    spec = CliSpec(help, flags, argument, metavar, min, max, min_open, choices, multiple, required, parse)
    return {CLI_KEY: spec}
