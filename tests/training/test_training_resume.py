"""`gym train run --resume`: a run killed mid-step continues from its last checkpoint exactly.

The first run is a real subprocess that SIGKILLs itself once step 1 is collected and logged but
before its update (so its checkpoint-1 exists and step 1's records are half a step ahead of it);
the resumed run must then hold, file by file, the same steps, prompts and quotas as a run that was
never interrupted, each step exactly once. The tiny in-code policy keeps it fast; it learns nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from click.testing import CliRunner

from polygym.cli import gym
from polygym.jsonl import iter_jsonl
from polygym.row import ROLLOUT_INDEX, TASK_INDEX
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

KILL_AFTER_STEP = 1
STEPS = 3
PROMPTS = 2
KILLER = f"""
import os, signal, sys
from polygym.training import trl_adapter
collect = trl_adapter.PolygymGRPO.rollout_func
def dying(self, prompts, trainer):
    out = collect(self, prompts, trainer)
    if self.next_step == {KILL_AFTER_STEP + 1}:  # step {KILL_AFTER_STEP} collected and logged, not trained
        os.kill(os.getpid(), signal.SIGKILL)
    return out
trl_adapter.PolygymGRPO.rollout_func = dying
from polygym.cli import gym
gym(sys.argv[1:])
"""
GAME: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "system", "content": "Guess."}], "max_output_tokens": 4},
    "game": {"low": 1, "high": 4, "secret": 2, "max_guesses": 2},
}


def spec_file(tmp_path: Path) -> Path:
    games = tmp_path / "games.jsonl"
    games.write_text(
        "".join(json.dumps({**GAME, "game": {**GAME["game"], "secret": s}}) + "\n" for s in (1, 3))
    )
    spec = tmp_path / "blend.yaml"
    spec.write_text(
        "environments:\n"
        "  mcqa: {}\n"
        "  guess_number:\n"
        "    agent: guess_number_gymnasium_agent\n"
        "    train: games.jsonl\n"
        "    validation: games.jsonl\n"
        f"prompts_per_step: {PROMPTS}\n"
        "responses_per_prompt: 2\n"
    )
    return spec


def args(spec: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "run", str(spec), "-o", str(out), "--model", "tiny", "--steps", str(STEPS),
        "--validation-limit", "1", "--max-output-tokens", "3", "--train-layers", "1",
        "--validate-every", "2", "--checkpoint-every", "1", "--dynamic-sampling", "1", "--seed", "3",
        *extra,
    ]  # fmt: skip


def planned(path: Path) -> list[tuple[int, int, Any]]:
    """(task, rollout, input) of the planned prompts (dynamic sampling's extras depend on rewards)."""
    stride = PROMPTS + 1 * 2  # --dynamic-sampling 1, two environments
    rows = [r for r in iter_jsonl(path) if r[TASK_INDEX] % stride < PROMPTS]
    return sorted((r[TASK_INDEX], r[ROLLOUT_INDEX], r["responses_create_params"]["input"]) for r in rows)


def fixed_fields(path: Path) -> list[tuple[Any, ...]]:
    keys = ("step", "env", "prompts", "rollouts", "planned_share", "target_share")
    return [tuple(line[k] for k in keys) for line in iter_jsonl(path)]


def test_a_killed_run_resumes_exactly(tmp_path: Path) -> None:
    spec = spec_file(tmp_path)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    result = CliRunner().invoke(gym, args(spec, whole), catch_exceptions=False)
    assert result.exit_code == 0, result.output

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, *args(spec, parts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    logged = {line["step"] for line in iter_jsonl(parts / "train_log.jsonl")}
    assert logged == set(range(KILL_AFTER_STEP + 1))  # step 1 was logged before its checkpoint
    assert not (parts / "summary.json").exists()

    resumed = CliRunner().invoke(gym, args(spec, parts, "--resume"), catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming at step {KILL_AFTER_STEP}" in resumed.output

    for name in ("train_log.jsonl",):
        assert fixed_fields(parts / name) == fixed_fields(whole / name)  # each step once, same quotas
    rollouts = parts / "rollouts"
    for name in ("train.jsonl", "train_materialized_inputs.jsonl"):
        assert planned(rollouts / name) == planned(whole / "rollouts" / name)
        keys = [(r[TASK_INDEX], r[ROLLOUT_INDEX]) for r in iter_jsonl(rollouts / name)]
        assert len(keys) == len(set(keys))  # nothing duplicated
    steps_of = lambda out: [line.get("step") for line in iter_jsonl(out / "trainer_log.jsonl")]  # noqa: E731
    assert steps_of(parts) == steps_of(whole)
    curves = lambda out: [(c["step"], c["env"]) for c in iter_jsonl(out / "validation.jsonl")]  # noqa: E731
    assert curves(parts) == curves(whole) == [(s, e) for s in (0, 2, 3) for e in ("mcqa", "guess_number")]
    summary = json.loads((parts / "summary.json").read_text())
    assert summary["resumed_at_step"] == KILL_AFTER_STEP
    assert summary["settings"]["dynamic_sampling"] == 1
    assert set(summary["dynamic_sampling"]) == {"mcqa", "guess_number", "_all"}


def test_resume_refuses_changed_settings_and_a_run_without_checkpoints(tmp_path: Path) -> None:
    spec = spec_file(tmp_path)
    out = tmp_path / "run"
    none = CliRunner().invoke(gym, args(spec, out, "--resume"))
    assert none.exit_code == 2 and "--resume: no run to resume in" in none.output
    assert not out.exists()
    out.mkdir()
    from polygym.training.checkpoint import start_fresh
    from polygym.training.run import RunSettings

    recorded = RunSettings(spec, out, model="tiny", steps=STEPS, learning_rate=0.5).to_dict()
    stale = out / "trainer" / "checkpoint-9"
    stale.mkdir(parents=True)
    start_fresh(out, out / "trainer", recorded)
    assert not stale.exists()  # a new run never resumes from an earlier run's checkpoint
    changed = CliRunner().invoke(gym, args(spec, out, "--resume"))
    assert changed.exit_code == 2 and "settings differ from the run" in changed.output
    assert "learning_rate: 0.5 -> 0.0001" in changed.output
