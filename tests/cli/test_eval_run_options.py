"""`gym eval run`: options a mode does not use are refused (exit 2), and --blend honours --seed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from polygym.blend.stepwise import StepFiles
from polygym.cli import gym
from polygym.cli.run_end import resume_command
from polygym.jsonl import iter_jsonl
from polygym.row import ROLLOUT_INDEX
from tests.conftest import TWO_ENV_SPEC as SPEC

SCRIPTED = ("--model-type", "scripted_model")
LATENCY = "policy_model.responses_api_models.scripted_model.latency_ms"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "blend.yaml"
    path.write_text(SPEC)
    return path


def eval_run(*args: str) -> Result:
    return CliRunner().invoke(gym, ["eval", "run", *args], catch_exceptions=False)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--num-repeats", "2"), ("--limit", "1"), ("--agent", "x"), ("--progress-interval", "10")],
)
def test_input_options_are_refused_with_blend(tmp_path: Path, spec: Path, option: str, value: str) -> None:
    result = eval_run(
        "--blend", str(spec), "--steps", "1", "--output", str(tmp_path / "o.jsonl"), option, value
    )
    assert result.exit_code == 2
    assert f"{option} does not apply with --blend" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("flag", ["--interleave-repeats", "--disable-aggregation"])
def test_nemo_gym_collection_flags_are_refused_with_blend(tmp_path: Path, spec: Path, flag: str) -> None:
    result = eval_run("--blend", str(spec), "--steps", "1", "--output", str(tmp_path / "o.jsonl"), flag)
    assert result.exit_code == 2 and f"{flag} does not apply with --blend" in result.stderr


@pytest.mark.parametrize(
    ("option", "value"), [("--steps", "1"), ("--start-step", "0"), ("--step-timeout", "5")]
)
def test_step_options_are_refused_without_blend(tmp_path: Path, option: str, value: str) -> None:
    """Given with its default value (``--start-step 0``) still counts as given: click's source says so."""
    data = tmp_path / "in.jsonl"
    data.write_text('{"responses_create_params": {"input": "hi"}}\n')
    result = eval_run(*SCRIPTED, "--input", str(data), "--output", str(tmp_path / "o.jsonl"), option, value)
    assert result.exit_code == 2
    assert f"{option} only applies with --blend SPEC" in result.stderr


def test_every_refused_option_is_named_at_once(tmp_path: Path, spec: Path) -> None:
    result = eval_run(
        "--blend", str(spec), "--steps", "1", "--output", "o.jsonl", "--limit", "1", "--agent", "a"
    )
    assert result.exit_code == 2
    assert "--limit does not apply" in result.stderr and "--agent does not apply" in result.stderr


def test_blend_run_sends_seed_plus_response_index(tmp_path: Path, spec: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = eval_run(*SCRIPTED, "--blend", str(spec), "--steps", "1", "--seed", "7", "--output", str(out))
    assert result.exit_code == 0, result.output
    files = StepFiles(out)
    for path in (files.output, files.materialized):
        rows = list(iter_jsonl(path))
        assert len(rows) == 8
        assert all(r["responses_create_params"]["seed"] == 7 + r[ROLLOUT_INDEX] for r in rows)
        assert {r[ROLLOUT_INDEX] for r in rows} == {0, 1}


def test_blend_run_honours_max_failures(tmp_path: Path, spec: Path) -> None:
    """Every rollout misses a short step deadline: stragglers count as failed rollouts."""
    out = tmp_path / "out.jsonl"
    args = (*SCRIPTED, "--blend", str(spec), "--steps", "1", "--step-timeout", "0.2", "--output", str(out))
    result = eval_run(*args, "--max-failures", "3", f"{LATENCY}=30000")
    assert result.exit_code == 1
    assert "8 of 8 rollouts failed (Straggler: 8): more than --max-failures 3" in result.stderr


def one_row(tmp_path: Path) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text('{"responses_create_params": {"input": "hi"}}\n')
    return data


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--timeout", "0", "0.0 is not in the range x>0"),
        ("--timeout", "-1", "-1.0 is not in the range x>0"),
        ("--num-repeats", "1000000", "'1000000' must be from 1 to 100000"),
        ("--num-repeats", "a_agent=0", "'a_agent=0' must be from 1 to 100000"),
        ("--concurrency", "100000", "'100000' must be from 1 to 16384"),
        ("--temperature", "5", "must be a number from 0 to 2, got 5.0"),
        ("--top-p", "1.5", "must be a number from 0 to 1, got 1.5"),
        ("--max-output-tokens", "0", "must be an integer of at least 1, got 0"),
        ("--max-failures", "-1", "'-1' must be at least 0"),
    ],
)
def test_out_of_range_values_exit_2_naming_the_option(
    tmp_path: Path, option: str, value: str, message: str
) -> None:
    """Refused before a stack starts: nothing is written, and a zero timeout never means a default."""
    out = tmp_path / "o.jsonl"
    result = eval_run(*SCRIPTED, "--input", str(one_row(tmp_path)), "--output", str(out), option, value)
    assert result.exit_code == 2
    assert option in result.stderr and message in result.stderr
    assert not out.exists()


def test_a_directory_as_input_is_named_as_one(tmp_path: Path) -> None:
    result = eval_run(*SCRIPTED, "--input", str(tmp_path), "--output", str(tmp_path / "o.jsonl"))
    assert result.exit_code == 2
    assert f"{tmp_path}: is a directory, not a JSONL file" in result.stderr


def test_a_bad_sampling_field_in_a_row_is_found_before_any_rollout(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(
        '{"responses_create_params": {"input": "hi"}}\n'
        '{"responses_create_params": {"input": "hi", "temperature": "hot"}}\n'
    )
    out = tmp_path / "o.jsonl"
    result = eval_run(*SCRIPTED, "--input", str(data), "--output", str(out))
    assert result.exit_code == 2
    assert f"{data}:2: responses_create_params.temperature: must be a number from 0 to 2, got 'hot'" in (
        result.stderr
    )
    assert not out.exists()


def test_env_start_refuses_a_port_out_of_range() -> None:
    result = CliRunner().invoke(gym, ["env", "start", *SCRIPTED, "--head-port", "70000"])
    assert result.exit_code == 2
    assert "Invalid value for '--head-port': 70000 is not in the range 0<=x<=65535" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


SECRET = "sk-live-0123456789abcdefghij"


def test_the_rerun_hint_masks_secrets_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rollout times out (the model takes 30 s, --timeout is 0.2 s): the run prints a rerun
    hint, which must not echo the API key given on the command line."""
    monkeypatch.chdir(tmp_path)
    one_row(tmp_path)
    args = [*SCRIPTED, "--resources-server", "example_single_tool_call", "--input", "in.jsonl"]
    args += ["--output", "o.jsonl", "--timeout", "0.2"]
    # A value no server used would be refused (exit 2), so the model reads the key.
    uses_key = "+policy_model.responses_api_models.scripted_model.api_key=${policy_api_key}"
    args += [f"{LATENCY}=30000", f"++policy_api_key={SECRET}", uses_key]
    monkeypatch.setattr(sys, "argv", ["gym", "eval", "run", *args])
    result = eval_run(*args)
    assert result.exit_code == 1, result.output  # its one rollout failed
    shown = " ".join(result.output.split())
    assert "rerun them with: gym eval run" in shown
    assert (
        "'++policy_api_key=****' '+policy_model.responses_api_models.scripted_model.api_key=****' "
        "--resume (secret values masked: pass them again)" in shown
    )
    assert SECRET not in result.output
    [failure] = iter_jsonl(tmp_path / "o_failures.jsonl")
    assert failure["error_class"] == "Timeout" and "0.2s" in failure["error"]


def test_the_resume_hint_has_no_note_when_nothing_was_masked() -> None:
    assert resume_command(["eval", "run", "--input", "in.jsonl", "--overwrite"]) == (
        "gym eval run --input in.jsonl --resume"
    )
    assert resume_command(["eval", "run", "--model-api-key", SECRET]) == (
        "gym eval run --model-api-key '****' --resume (secret values masked: pass them again)"
    )
