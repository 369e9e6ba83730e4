"""`gym list environments`: every environment found, from its config and its server class."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym.authoring.scaffold import create_environment
from polygym.cli import gym
from polygym.stack.environment import describe_environment
from tests.conftest import ROOT, gym_command

pytestmark = pytest.mark.e2e


def test_json_lists_user_and_shipped_environments(tmp_path: Path) -> None:
    create_environment("zz_user_env", tmp_path)
    done = subprocess.run(
        gym_command("list", "environments", "--json"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    infos = {info["name"]: info for info in json.loads(done.stdout)}
    user = infos["zz_user_env"]
    assert user["tools"] == ["multiply"]
    assert user["domain"] == "math"
    assert user["description"].startswith("Multiply two numbers")
    assert user["datasets"] == [
        {
            "name": "example",
            "type": "example",
            "jsonl_fpath": "resources_servers/zz_user_env/data/example.jsonl",
            "agent": "zz_user_env_simple_agent",
        }
    ]
    assert user["directory"] == str(tmp_path / "resources_servers" / "zz_user_env")
    shipped = infos["example_multi_step"]
    assert shipped["tools"] == ["get_synonym_value", "extract_synonym_values"]
    assert shipped["domain"] == "agent"
    assert [d["name"] for d in shipped["datasets"]] == ["example"]
    assert list(infos) == sorted(infos)


def test_table(tmp_path: Path) -> None:
    done = subprocess.run(
        gym_command("list", "environments"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for text in ("name", "domain", "tools", "datasets", "description", "example_single_tool_call"):
        assert text in done.stdout
    line = next(line for line in done.stdout.splitlines() if "example_multi_step" in line)
    assert "get_synonym_value, extract_synonym_values" in line and "agent" in line


def test_a_broken_environment_is_listed_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = tmp_path / "resources_servers" / "zz_broken_listing"
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "app.py").write_text("raise ImportError('missing dependency: frobnicate')\n")
    (env_dir / "configs" / "zz_broken_listing.yaml").write_text(
        "zz_broken_listing:\n  resources_servers:\n    zz_broken_listing:\n      domain: games\n"
    )
    monkeypatch.chdir(tmp_path)
    info = describe_environment("zz_broken_listing")
    assert "missing dependency: frobnicate" in info["error"]
    assert info["tools"] == []

    result = CliRunner().invoke(gym, ["list", "environments", "--json"])
    assert result.exit_code == 0, result.output
    listed = {info["name"]: info for info in json.loads(result.output)}
    assert listed["zz_broken_listing"]["error"]  # reported, not raised
    assert listed["example_single_tool_call"]["tools"] == ["get_weather"]  # the others still load


def test_a_nemo_gym_environment_is_listed_from_its_config_without_importing_it(
    fake_nemo_gym_env: dict[str, str],
) -> None:
    info = describe_environment("ng_env")
    assert "error" not in info, info["error"]
    assert info["nemo_gym"] is True and info["domain"] == "math" and info["tools"] == []


def test_list_suggests_the_closest_command() -> None:
    result = CliRunner().invoke(gym, ["list", "enviroments"])
    assert result.exit_code == 2
    assert "Did you mean 'environments'?" in result.output
