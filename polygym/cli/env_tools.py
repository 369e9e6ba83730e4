"""Authoring commands: ``gym env init``, ``gym env check`` and ``gym list environments``."""

from __future__ import annotations

import click

from polygym.cli.base import SuggestingGroup


@click.group("list", cls=SuggestingGroup)
def list_group() -> None:
    """List what this installation offers."""


ENV_COMMANDS: list[click.Command] = []
