"""What the commands that run rollouts share: choosing the stack (start one or join one), the
resume hint they print, and the option types they parse."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from polygym.cli.base import EXIT_USAGE, fail, load_stack_config
from polygym.cli.placement_options import placement_options, replica_counts
from polygym.errors import ConfigError
from polygym.stack import records as stacks
from polygym.stack.placement import BACKENDS, parse_workers
from polygym.stack.session import StackTarget

if TYPE_CHECKING:
    from polygym.blend.spec import BlendSpec

F = TypeVar("F", bound=Callable[..., Any])


def discover_head(head_url: str | None) -> str:
    """The head server to use with --no-serve: explicit, from the environment, or the one stack."""
    url = head_url or os.environ.get("POLYGYM_HEAD_URL")
    if url:
        return url
    running = stacks.list_stacks()
    if not running:
        fail(
            "--no-serve: no running stack found; start one with `gym env start ...` or pass --head-url",
            EXIT_USAGE,
        )
    if len(running) > 1:
        heads = ", ".join(r["head_url"] for r in running)
        fail(f"--no-serve: {len(running)} stacks are running ({heads}); pick one with --head-url", EXIT_USAGE)
    return running[0]["head_url"]


def stack_options(func: F) -> F:
    """The options choosing the stack a command runs against (``stack_target`` reads them): start one
    (``--backend`` and the placement options) or join a running one (``--no-serve``, ``--head-url``)."""
    func = placement_options(func)
    func = click.option(
        "--backend", type=click.Choice(sorted(BACKENDS)), default="inline", show_default=True
    )(func)
    func = click.option(
        "--head-url", default=None, help="Head server of the running stack (with --no-serve)."
    )(func)
    return click.option("--no-serve", is_flag=True, help="Use a running stack instead of starting one.")(func)


def stack_target(opts: dict[str, Any], spec: BlendSpec | None = None) -> StackTarget:
    """The running stack (``--no-serve``) or the one to start from the selectors (and ``spec``)."""
    if opts["no_serve"]:
        return StackTarget(head_url=discover_head(opts["head_url"]))
    selectors = (opts["resources_servers"], opts["model_types"], opts["configs"], opts["overrides"])
    if spec is None:
        config = load_stack_config(*selectors)
    else:
        from polygym.cli.blend_run import blend_stack_config  # blending's imports, for --blend only

        config = blend_stack_config(spec, *selectors)
    try:
        replicas = replica_counts(opts["replicas"], config)
        workers = parse_workers(opts["workers"])
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    return StackTarget(
        config, backend=opts["backend"], ray_address=opts["ray_address"], replicas=replicas, workers=workers
    )
