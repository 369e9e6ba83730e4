"""``RAY_ADDRESS`` is Ray's variable, read when Ray is used, not ``--ray-address`` given."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from polygym.cli.placement_options import placement_options, refuse_when_joining


def _command(seen: dict[str, Any]) -> click.Command:
    @click.command()
    @click.option("--no-serve", is_flag=True)
    @placement_options
    @click.pass_context
    def command(ctx: click.Context, **opts: Any) -> None:
        refuse_when_joining(ctx, opts)
        seen.update(opts)

    return command


@pytest.mark.parametrize("args", [[], ["--no-serve"]])
def test_ray_address_in_the_environment_is_not_the_option(args: list[str]) -> None:
    seen: dict[str, Any] = {}
    result = CliRunner().invoke(_command(seen), args, env={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert result.exit_code == 0, result.output
    assert seen["ray_address"] is None  # the Ray backend reads it, after the config (cluster_address)


def test_the_option_is_still_refused_when_joining() -> None:
    result = CliRunner().invoke(_command({}), ["--no-serve", "--ray-address", "10.0.0.1:6379"])
    assert result.exit_code == 2
    assert "--ray-address only applies to a stack this command starts" in result.output
