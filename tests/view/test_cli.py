"""`gym view`: a path that is no run exits 2 naming it; --export writes the report; Ctrl-C is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym.cli import gym
from polygym.cli.base import EXIT_INTERRUPTED
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


@pytest.mark.e2e
def test_ctrl_c_stops_with_one_line(tmp_path: Path) -> None:
    write(tmp_path / "run.jsonl", [rollout("a", 0, 0, 1.0)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "polygym", "view", str(tmp_path / "run.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the URL is printed (or the process ends)
        assert "http://127.0.0.1:" in line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED and err == "gym view: stopped\n"
