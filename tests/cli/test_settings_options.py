"""Options generated from a settings dataclass: each setting declared once (``polygym.settings``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import click
from click.testing import CliRunner

from polygym.cli.settings_options import given, settings_from, settings_options
from polygym.settings import CLI_KEY, cli


@dataclass
class Example:
    source: Path = field(metadata=cli("", argument=True, metavar="SRC"))
    count: int = field(default=3, metadata=cli("How many.", "--count", "-n", min=1))
    share: float | None = field(default=None, metadata=cli("A share.", min=0, max=1))
    mode: Literal["fast", "slow"] = field(default="fast", metadata=cli("Which way."))
    dry: bool = field(default=False, metadata=cli("Change nothing."))
    tags: tuple[str, ...] = field(default=(), metadata=cli("A tag (repeatable).", metavar="TAG"))
    internal: int = 0


def _command(seen: list[Any]) -> click.Command:
    @click.command()
    @settings_options(Example)
    def command(**values: Any) -> None:
        seen.append((settings_from(Example, values), given("count")))

    return command


def test_each_field_becomes_its_option_with_its_type_default_and_help() -> None:
    seen: list[Any] = []
    result = CliRunner().invoke(
        _command(seen), ["in.txt", "-n", "5", "--mode", "slow", "--dry", "--tags", "a", "--tags", "b"]
    )
    assert result.exit_code == 0, result.output
    assert seen == [(Example(Path("in.txt"), 5, None, "slow", True, ("a", "b")), True)]
    help_text = CliRunner().invoke(_command([]), ["--help"]).output
    assert "Usage: command [OPTIONS] SRC" in help_text
    assert "-n, --count INTEGER RANGE" in help_text and "[default: 3; x>=1]" in help_text
    assert "--mode [fast|slow]" in help_text and "--tags TAG" in help_text
    assert "--internal" not in help_text  # a field without a cli spec has no option


def test_defaults_come_from_the_fields_and_given_tells_them_apart() -> None:
    seen: list[Any] = []
    assert CliRunner().invoke(_command(seen), ["in.txt"]).exit_code == 0
    assert seen == [(Example(Path("in.txt")), False)]


def test_a_value_out_of_bounds_exits_2_naming_the_option() -> None:
    result = CliRunner().invoke(_command([]), ["in.txt", "--share", "1.5"])
    assert result.exit_code == 2 and "--share" in result.output


def test_every_gym_train_run_setting_is_an_option_declared_by_its_field() -> None:
    from polygym.cli.train import run
    from polygym.training.run_settings import RunSettings

    params = {p.name: p for p in run.params}
    for f in dataclasses.fields(RunSettings):
        if f.name == "trainer_overrides":
            assert f.name not in params
            continue
        spec = f.metadata[CLI_KEY]
        assert spec.argument or params[f.name].help == spec.help


def test_a_command_can_give_a_shared_setting_its_own_default_and_help() -> None:
    from polygym.cli.train import compare_mixes_command

    steps = next(p for p in compare_mixes_command.params if p.name == "steps")
    assert steps.default == 20 and isinstance(steps, click.Option) and steps.help == "Steps per arm."


def _halves(text: str) -> Fraction:
    value = Fraction(text)
    if value.denominator not in (1, 2):
        raise ValueError(f"'{text}' is not a whole or half number")
    return value


@dataclass
class Parsed:
    step: Fraction = field(default=Fraction(1, 2), metadata=cli("A half step.", metavar="N/2", parse=_halves))
    wait_s: float = field(default=1.0, metadata=cli("Seconds.", "--wait", min=0, min_open=True))


def test_a_field_with_its_own_parse_and_an_open_bound() -> None:
    seen: list[Parsed] = []

    @click.command()
    @settings_options(Parsed)
    def command(**values: Any) -> None:
        seen.append(settings_from(Parsed, values))

    runner = CliRunner()
    assert runner.invoke(command, []).exit_code == 0 and seen[-1] == Parsed()  # the default kept as is
    assert runner.invoke(command, ["--step", "3/2", "--wait", "0.5"]).exit_code == 0
    assert seen[-1] == Parsed(Fraction(3, 2), 0.5)
    bad = runner.invoke(command, ["--step", "1/3"])
    assert bad.exit_code == 2 and "'1/3' is not a whole or half number" in bad.output
    assert runner.invoke(command, ["--wait", "0"]).exit_code == 2  # min_open: 0 itself is refused
    shown = " ".join(runner.invoke(command, ["--help"]).output.split())
    assert "--step N/2 A half step. [default: 1/2]" in shown and "x>0" in shown
