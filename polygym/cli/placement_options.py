"""The options that place a started stack's servers, shared by ``gym env start`` and ``gym eval run``.

``--ray-address`` and ``--replicas`` only mean something for the Ray backend, ``--workers`` for the
inline and Ray ones, and all three for a stack this command starts; given anywhere else they are refused
(exit 2) instead of silently ignored.

``RAY_ADDRESS`` is not ``--ray-address``: Ray reads it only when a program connects to Ray, and so
does polygym (``cluster_address``: after ``--ray-address`` and the config's ``ray_address``, for
``--backend ray`` alone). Read as the option, a variable that a Ray job sets in every process it
runs made the inline backend refuse to start and ``--no-serve`` refuse to join.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from polygym.cli.base import refuse_given
from polygym.stack.placement import parse_replicas

if TYPE_CHECKING:
    from polygym.stack.config import StackConfig

F = TypeVar("F", bound=Callable[..., Any])


def placement_options(func: F) -> F:
    """Add ``--ray-address``, ``--replicas NAME=N`` (repeatable) and ``--workers N|auto`` to a command."""
    func = click.option(
        "--workers",
        default=None,
        metavar="N|auto",
        help="Run N copies of the whole stack, one process each (with --backend ray: one Ray actor "
        "each, spread over the nodes), and spread rollouts over them (auto: one per core this "
        "process may use); calls inside a copy stay in-process.",
    )(func)
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
        help="Ray cluster to join with --backend ray [default: config ray_address, else "
        "RAY_ADDRESS, else a local cluster started for this stack].",
    )(func)


def replica_counts(values: tuple[str, ...], config: StackConfig) -> dict[str, int]:
    """``--replicas`` values checked against the stack's server names (ConfigError otherwise)."""
    return parse_replicas(values, config.servers)


NOT_WHEN_JOINING = {
    "ray_address": "only applies to a stack this command starts, not with --no-serve",
    "replicas": "only applies to a stack this command starts, not with --no-serve",
    "backend": "only applies to a stack this command starts, not with --no-serve",
    "workers": "only applies to a stack this command starts, not with --no-serve",
}


def refuse_when_joining(ctx: click.Context, opts: dict[str, Any]) -> None:
    """Exit 2 naming the placement options given with ``--no-serve`` (they would be ignored)."""
    if opts["no_serve"]:
        refuse_given(ctx, NOT_WHEN_JOINING)
