"""``gym data``: build and check datasets for several environments."""

from __future__ import annotations

import click

from polygym.cli.base import SuggestingGroup


@click.group(cls=SuggestingGroup)
def data() -> None:
    """Blend and validate datasets across environments."""
