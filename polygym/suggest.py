"""Did-you-mean suggestions, shared by the CLI, config checks and dataset validation.

Every "unknown name" error in polygym should tell the user what they probably meant and what
exists, so that a typo costs one glance instead of a trip to the docs.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, known: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Return up to ``n`` known names that look like ``name``, best first."""
    return difflib.get_close_matches(name, sorted(set(known)), n=n, cutoff=cutoff)


def unknown_name_message(what: str, name: str, known: Iterable[str]) -> str:
    """Format "unknown <what> 'name'. Did you mean 'x'? Known: a, b" for error messages."""
    known_list = sorted(set(known))
    message = f"unknown {what} '{name}'."
    match = closest(name, known_list)
    if match:
        message += f" Did you mean '{match[0]}'?"
    message += f" Known: {', '.join(known_list) if known_list else '(none)'}"
    return message
