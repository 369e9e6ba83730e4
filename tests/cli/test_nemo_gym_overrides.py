"""NeMo Gym's command lines in `gym eval run`: Hydra row overrides, its flags, and refusals (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from polygym.cli import gym
from polygym.collect.row_overrides import split_overrides
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


def test_row_override_that_blend_does_not_use_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "blend.yaml"
    spec.write_text(TWO_ENV_SPEC)
    out = tmp_path / "o.jsonl"
    result = eval_run("--blend", str(spec), "--steps", "1", "-o", str(out), "+num_repeats=3")
    assert result.exit_code == 2
    assert "override '+num_repeats=3' does not apply with --blend" in result.stderr
    assert not out.exists()
