"""`gym view`: a path that is no run exits 2 naming it; --export writes the report."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from polygym.cli import gym
from tests.view.test_data import rollout, write


def test_not_a_run_exits_2_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(gym, ["view", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2 and "missing.jsonl: no such run" in result.stderr


def test_export_writes_one_file(tmp_path: Path) -> None:
    write(tmp_path / "run.jsonl", [rollout("a", 0, 0, 1.0)])
    result = CliRunner().invoke(
        gym, ["view", str(tmp_path / "run.jsonl"), "--export", str(tmp_path / "r.html")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    both = CliRunner().invoke(gym, ["view", str(tmp_path / "run.jsonl"), "--export", "x.html", "--port", "8"])
    assert both.exit_code == 2 and "--port and --export" in both.stderr
