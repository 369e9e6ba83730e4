"""``gym train``: plan and run multi-environment training."""

from __future__ import annotations

import click

from polygym.cli.base import SuggestingGroup


@click.group(cls=SuggestingGroup)
def train() -> None:
    """Plan and run training on a blend of environments."""
