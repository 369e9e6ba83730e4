"""`gym eval run`: options a mode does not use are refused (exit 2), and --blend honours --seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from polygym.blend.stepwise import StepFiles
from polygym.cli import gym
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
    assert "8 rollouts failed or straggled (--max-failures 3)" in result.stderr
