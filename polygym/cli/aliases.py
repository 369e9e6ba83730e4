"""NeMo Gym's ``ng_*`` commands, each the ``gym`` command that does the same in polygym.

Scripts and muscle memory written for NeMo Gym (``ng_run``, ``ng_collect_rollouts`` ...) keep
working: each alias runs its ``gym`` command with the rest of the command line unchanged, and
says once on stderr which command that is. Only commands that exist in both are aliased; the
table is NeMo Gym's own mapping of its legacy names to ``gym`` subcommands, where polygym has one.
The other ``ng_*`` scripts exist too, to exit 2 saying what to use instead
(``polygym.cli.nemo_gym_commands``) rather than "command not found".
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from polygym.cli import gym
from polygym.cli.nemo_gym_commands import LEGACY_NOT_PROVIDED, legacy_not_provided

ALIASES: dict[str, tuple[str, ...]] = {
    "ng_run": ("env", "start"),
    "ng_collect_rollouts": ("eval", "run", "--no-serve"),
    "ng_e2e_collect_rollouts": ("eval", "run"),
    "ng_status": ("env", "status"),
    "ng_dump_config": ("env", "resolve"),
    "ng_init_resources_server": ("env", "init"),
    "ng_help": ("--help",),
    "ng_version": ("--version",),
}
"""``ng_*`` name -> the ``gym`` words it stands for."""
NOT_PROVIDED_SCRIPTS = (*LEGACY_NOT_PROVIDED, "ng_reinstall")
"""``ng_*`` scripts installed only to say what to use instead of them."""


def main() -> None:
    """The entry point of every alias: which one ran is the program name, as with NeMo Gym's."""
    alias = Path(sys.argv[0]).name
    words = ALIASES.get(alias)
    if words is None:
        message = legacy_not_provided(alias) or f"'{alias}' is not a known ng_* alias; run gym --help"
        click.secho(f"error: {message}", fg="red", err=True)
        sys.exit(2)
    click.echo(f"{alias}: running gym {' '.join(words)}", err=True)
    gym(args=[*words, *sys.argv[1:]], prog_name="gym")
