"""The ``gym`` command: ``gym env ...``, ``gym eval ...`` and friends.

Every group suggests the closest command on a typo (click already does so for options), so a
mistyped command costs a glance instead of a trip to ``--help``. Each group's module is imported
the first time the group is asked for (``LazyCommands``): ``gym eval run`` imported every group's
dependencies (blending, training, the viewer: ~1 s of a 2,000-row run's time outside its window)
before doing anything.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from polygym import __version__
from polygym.cli.base import SuggestingGroup
from polygym.cli.lazy import LazyCommands


def _env() -> click.Command:
    """The stack commands, and the authoring and cache ones loaded when asked for (``gym env
    start`` need not import the environment checker, its HTTP client and the scaffold)."""
    from polygym.cli.env import env

    commands = LazyCommands({"init": _env_tool("init"), "check": _env_tool("check"), "prune": _prune})
    for name, command in env.commands.items():
        commands[name] = command
    env.commands = commands
    return env


def _env_tool(name: str) -> Callable[[], click.Command]:
    def load() -> click.Command:
        from polygym.cli.env_tools import ENV_COMMANDS

        return next(command for command in ENV_COMMANDS if command.name == name)

    return load


def _prune() -> click.Command:
    from polygym.cli.env_prune import prune_command

    return prune_command


def _eval() -> click.Command:
    from polygym.cli.eval import eval_group

    return eval_group


def _data() -> click.Command:
    from polygym.cli.data import data

    return data


def _train() -> click.Command:
    from polygym.cli.train import train
    from polygym.cli.watch import watch_command

    train.add_command(watch_command)
    return train


def _list() -> click.Command:
    from polygym.cli.env_tools import list_group

    return list_group


def _view() -> click.Command:
    from polygym.cli.view import view

    return view


@click.group(
    cls=SuggestingGroup,
    commands=LazyCommands(
        {"env": _env, "eval": _eval, "data": _data, "train": _train, "list": _list, "view": _view}
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", "-V", prog_name="polygym")
def gym() -> None:
    """polygym: train and evaluate LLM policies on many environments at once."""


def main() -> None:
    gym(prog_name="gym")
