"""The ``gym`` command: ``gym env ...``, ``gym eval ...`` and friends.

Every group suggests the closest command on a typo (click already does so for options), so a
mistyped command costs a glance instead of a trip to ``--help``.
"""

from __future__ import annotations

import click

from polygym import __version__
from polygym.cli.base import SuggestingGroup
from polygym.cli.data import data
from polygym.cli.env import env
from polygym.cli.env_tools import ENV_COMMANDS, list_group
from polygym.cli.eval import eval_group
from polygym.cli.train import train
from polygym.cli.view import view


@click.group(cls=SuggestingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="polygym")
def gym() -> None:
    """polygym: train and evaluate LLM policies on many environments at once."""


for command in ENV_COMMANDS:
    env.add_command(command)
gym.add_command(env)
gym.add_command(eval_group, name="eval")
gym.add_command(data)
gym.add_command(train)
gym.add_command(list_group)
gym.add_command(view)


def main() -> None:
    gym(prog_name="gym")


from polygym.cli.watch import watch_command  # noqa: E402

train.add_command(watch_command)
