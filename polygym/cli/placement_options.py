"""The options that place a started stack's servers, shared by ``gym env start`` and ``gym eval run``.

``--ray-address`` and ``--replicas`` only mean something for the Ray backend and for a stack this
command starts; given anywhere else they are refused (exit 2) instead of silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from polygym.cli.base import refuse_given
from polygym.stack.config import StackConfig
from polygym.stack.placement import parse_replicas

F = TypeVar("F", bound=Callable[..., Any])


def placement_options(func: F) -> F:
    """Add ``--ray-address`` and ``--replicas NAME=N`` (repeatable) to a command."""
    func = click.option(
        "--replicas",
        "replicas",
        multiple=True,
        metavar="NAME=N",
        help="Run N replicas of server NAME (--backend ray); overrides its config's replicas.",
    )(func)
    return click.option(
        "--ray-address",
        default=None,
        envvar="RAY_ADDRESS",
        help="Ray cluster to join with --backend ray [default: config ray_address, else a local "
        "cluster started for this stack].",
    )(func)


def replica_counts(values: tuple[str, ...], config: StackConfig) -> dict[str, int]:
    """``--replicas`` values checked against the stack's server names (ConfigError otherwise)."""
    return parse_replicas(values, config.servers)


NOT_WHEN_JOINING = {
    "ray_address": "only applies to a stack this command starts, not with --no-serve",
    "replicas": "only applies to a stack this command starts, not with --no-serve",
    "backend": "only applies to a stack this command starts, not with --no-serve",
}


def refuse_when_joining(ctx: click.Context, opts: dict[str, Any]) -> None:
    """Exit 2 naming the placement options given with ``--no-serve`` (they would be ignored)."""
    if opts["no_serve"]:
        refuse_given(ctx, NOT_WHEN_JOINING)
