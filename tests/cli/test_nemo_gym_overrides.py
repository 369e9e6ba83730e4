"""NeMo Gym's command lines in `gym eval run`: Hydra row overrides, its flags, and refusals (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from polygym.cli import gym
from polygym.cli.base import ALLOW_UNSUPPORTED_PAIRING_ENV_VAR
from polygym.collect.row_overrides import split_overrides
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl
from polygym.stack.catalog import project_root
from tests.conftest import TWO_ENV_SPEC

ENV = ("--model-type", "scripted_model", "--resources-server", "example_single_tool_call")


def eval_run(*args: str) -> Result:
    return CliRunner().invoke(gym, ["eval", "run", *args], catch_exceptions=False)


@pytest.fixture
def ten_rows(tmp_path: Path) -> Path:
    """Ten rows: the example environment's five, twice."""
    example = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"
    lines = example.read_text().splitlines()
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines + lines) + "\n")
    assert len(path.read_text().splitlines()) == 10
    return path


def test_split_overrides_tells_row_settings_from_config() -> None:
    config, row = split_overrides(
        [
            ("+num_repeats=3", "num_repeats", 3),
            ("++responses_create_params.temperature=0.5", "responses_create_params.temperature", 0.5),
            ("policy_model.x=1", "policy_model.x", 1),
            ("+split=train", "split", "train"),
        ]
    )
    assert config == ["policy_model.x=1"]
    assert row.options == {"--num-repeats": ("+num_repeats=3", 3)}
    assert row.sampling == {"temperature": 0.5}
    assert row.refused and "'+split=train'" in row.refused[0]


def test_hydra_row_overrides_reach_every_row(tmp_path: Path, ten_rows: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = eval_run(
        *ENV,
        "-i",
        str(ten_rows),
        "-o",
        str(out),
        "+num_repeats=3",
        "++responses_create_params.temperature=0.5",
        "+responses_create_params.top_p=0.9",
    )
    assert result.exit_code == 0, result.output
    rows = list(iter_jsonl(out))
    assert len(rows) == 30
    params = [row["responses_create_params"] for row in rows]
    assert all(p["temperature"] == 0.5 and p["top_p"] == 0.9 for p in params)


def test_output_as_override(tmp_path: Path, ten_rows: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = eval_run(*ENV, "-i", str(ten_rows), f"+output_jsonl_fpath={out}", "+limit=2")
    assert result.exit_code == 0, result.output
    assert len(list(iter_jsonl(out))) == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--split", "train"), "--split cannot be honoured"),
        (("--prompt-config", "p.yaml"), "--prompt-config cannot be honoured"),
        (("+prompt_config=p.yaml",), "override '+prompt_config=p.yaml' cannot be honoured"),
        (("+num_repeats=3", "--num-repeats", "2"), "'+num_repeats=3' and --num-repeats"),
        (("++responses_create_params.temperature=0.5", "--temperature", "1"), "both set temperature"),
        (("+responses_create_params.temperature=9",), "responses_create_params.temperature"),
        (("+responses_create_params.a.b=1",), "only top-level responses_create_params fields"),
        (("+no_such_setting=1",), "no_such_setting"),
        (("--no-health-check",), "--no-health-check cannot be honoured"),
        (("--health-check-workers", "2"), "--health-check-workers cannot be honoured"),
        (("--health-check-ignore", "x"), "--health-check-ignore cannot be honoured"),
        (("--benchmark", "aime24"), "--benchmark cannot be honoured"),
        (("--environment", "calendar"), "--environment cannot be honoured"),
        (("--agent-type", "simple_agent"), "--agent-type cannot be honoured"),
        (("+interleave_repeats=maybe",), "interleave_repeats must be true or false"),
    ],
)
def test_what_cannot_be_honoured_exits_2_naming_it(
    tmp_path: Path, ten_rows: Path, args: tuple[str, ...], named: str
) -> None:
    out = tmp_path / "out.jsonl"
    result = eval_run(*ENV, "-i", str(ten_rows), "-o", str(out), *args)
    assert result.exit_code == 2, result.output
    assert named in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("flag", [("--interleave-repeats",), ("+interleave_repeats=true",)])
def test_interleave_repeats_sends_repeats_round_by_round(
    tmp_path: Path, ten_rows: Path, flag: tuple[str, ...]
) -> None:
    """NeMo Gym's abcabc order: the materialized inputs are written in the order jobs are sent (the
    five rows twice: five tasks of four rollouts each)."""
    out = tmp_path / "out.jsonl"
    result = eval_run(*ENV, "-i", str(ten_rows), "-o", str(out), "--num-repeats", "2", *flag)
    assert result.exit_code == 0, result.output
    sent = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in iter_jsonl(RunFiles(out).materialized)]
    assert sent == [(task, rollout) for rollout in range(4) for task in range(5)]
    assert len(list(iter_jsonl(out))) == 20


@pytest.mark.parametrize("flag", [("--disable-aggregation",), ("+disable_aggregation=true",)])
def test_disable_aggregation_writes_no_metrics_file(
    tmp_path: Path, ten_rows: Path, flag: tuple[str, ...]
) -> None:
    out = tmp_path / "out.jsonl"
    result = eval_run(*ENV, "-i", str(ten_rows), "-o", str(out), *flag)
    assert result.exit_code == 0, result.output
    assert len(list(iter_jsonl(out))) == 10
    assert not RunFiles(out).metrics.exists()
    assert "_aggregate_metrics.json" not in result.stdout


def test_allow_unsupported_pairing_and_search_dir_are_taken(
    tmp_path: Path, ten_rows: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """polygym never refuses a pairing, and passes the flag on to NeMo Gym's servers, which do;
    --search-dir is --nemo-gym-root."""
    monkeypatch.setenv(ALLOW_UNSUPPORTED_PAIRING_ENV_VAR, "0")  # restored after the test
    out = tmp_path / "out.jsonl"
    flags = ("--allow-unsupported-pairing", "--search-dir", str(tmp_path))
    result = eval_run(*ENV, "-i", str(ten_rows), "-o", str(out), "--limit", "1", *flags)
    assert result.exit_code == 0, result.output
    assert len(list(iter_jsonl(out))) == 1
    assert os.environ[ALLOW_UNSUPPORTED_PAIRING_ENV_VAR] == "1"  # what NeMo Gym's children inherit
    result = eval_run(*ENV, "-i", str(ten_rows), "-o", str(out), "--search-dir", str(tmp_path / "none"))
    assert result.exit_code == 2 and "not a directory" in result.output


def test_row_override_that_blend_does_not_use_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "blend.yaml"
    spec.write_text(TWO_ENV_SPEC)
    out = tmp_path / "o.jsonl"
    result = eval_run("--blend", str(spec), "--steps", "1", "-o", str(out), "+num_repeats=3")
    assert result.exit_code == 2
    assert "override '+num_repeats=3' does not apply with --blend" in result.stderr
    assert not out.exists()
