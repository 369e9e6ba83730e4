"""NeMo Gym's ``ng_*`` console scripts and model flags run the matching ``gym`` command."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym import __version__
from polygym.cli import gym
from polygym.cli.aliases import ALIASES, NOT_PROVIDED_SCRIPTS, main
from polygym.cli.nemo_gym_commands import LEGACY_NOT_PROVIDED, NOT_PROVIDED
from polygym.stack.catalog import project_root


def test_every_alias_is_a_console_script_and_names_a_gym_command() -> None:
    scripts = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["scripts"]
    aliased = {name for name, target in scripts.items() if target == "polygym.cli.aliases:main"}
    assert aliased == set(ALIASES) | set(NOT_PROVIDED_SCRIPTS)
    for words in ALIASES.values():
        commands = [word for word in words if not word.startswith("-")]
        group = gym
        for word in commands:
            group = group.commands[word]  # type: ignore[attr-defined]


def test_alias_runs_its_gym_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/bin/ng_version"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    captured = capsys.readouterr()
    assert __version__ in captured.out and "ng_version: running gym --version" in captured.err


def test_unknown_alias_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["ng_nope"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2 and "ng_nope" in capsys.readouterr().err


@pytest.mark.parametrize("alias", NOT_PROVIDED_SCRIPTS)
def test_an_ng_script_polygym_lacks_says_what_to_use_instead(
    alias: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [f"/usr/bin/{alias}", "+input_jsonl_fpath=x.jsonl"])
    with pytest.raises(SystemExit) as exited:
        main()
    err = " ".join(capsys.readouterr().err.split())
    assert (
        exited.value.code == 2 and f"'{alias}' is NeMo Gym's" in err and "polygym does not provide it" in err
    )
    if alias in LEGACY_NOT_PROVIDED:
        assert NOT_PROVIDED[LEGACY_NOT_PROVIDED[alias]] in err


@pytest.mark.parametrize("command", sorted(NOT_PROVIDED))
def test_a_nemo_gym_command_polygym_lacks_exits_2_saying_what_to_use_instead(command: str) -> None:
    result = CliRunner().invoke(gym, [*command.split(), "--some-flag"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"'gym {command}' is NeMo Gym's; polygym does not provide it: {NOT_PROVIDED[command]}" in text


def test_the_commands_polygym_lacks_are_not_polygym_commands() -> None:
    for command in NOT_PROVIDED:
        group, *rest = command.split()
        assert group not in gym.commands or rest[0] not in gym.commands[group].commands  # type: ignore[attr-defined]


def test_model_flags_set_the_policy_globals(tmp_path: Path) -> None:
    args = [
        "env",
        "resolve",
        "--resources-server",
        "example_single_tool_call",
        "--model-type",
        "openai_model",
    ]
    flags = ["-m", "gpt-x", "--model-url", "http://127.0.0.1:9/v1", "--model-api-key", "sk-zz"]
    result = CliRunner().invoke(gym, [*args, *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (
        "openai_model: gpt-x" in result.stdout and "openai_base_url: http://127.0.0.1:9/v1" in result.stdout
    )
    assert "sk-zz" not in result.output


def test_model_flag_no_config_uses_exits_2() -> None:
    args = ["env", "resolve", "--resources-server", "example_single_tool_call", "--model", "gpt-x"]
    result = CliRunner().invoke(gym, args, catch_exceptions=False)
    assert result.exit_code == 2
    assert "'policy_model_name' cannot be honoured" in result.stderr


def test_config_paths_override_selects_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NeMo Gym's way of choosing configs: `gym env resolve "+config_paths=[a.yaml,b.yaml]"`."""
    files = "responses_api_models/scripted_model/configs/scripted_model.yaml"
    files += ",resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
    monkeypatch.chdir(tmp_path)  # the files are found under polygym's project root
    result = CliRunner().invoke(gym, ["env", "resolve", f"+config_paths=[{files}]"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "scripted_model:" in result.stdout and "example_single_tool_call_simple_agent:" in result.stdout
    assert "local_model" not in result.stdout
