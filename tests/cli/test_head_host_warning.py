"""``gym env start --head-host`` on an address other machines can reach says so before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym.cli import gym
from polygym.cli.env import exposure_warning


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "10.1.2.3", "gym.example"])
def test_an_address_other_machines_reach_is_warned_about(host: str) -> None:
    warning = exposure_warning(host)
    assert warning is not None and warning.startswith(f"--head-host {host}")
    assert "POLYGYM_ALLOWED_HOSTS" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_is_not_warned_about(host: str) -> None:
    assert exposure_warning(host) is None


def test_env_start_prints_the_warning_first(tmp_path: Path) -> None:
    """The warning comes before anything else can fail (here: a config file that is not there)."""
    missing = str(tmp_path / "missing.yaml")
    result = CliRunner().invoke(gym, ["env", "start", "--config", missing, "--head-host", "0.0.0.0"])
    assert result.exit_code == 2
    assert result.stderr.startswith("warning: --head-host 0.0.0.0 (every network interface):")
    quiet = CliRunner().invoke(gym, ["env", "start", "--config", missing])
    assert quiet.exit_code == 2 and "warning" not in quiet.stderr
