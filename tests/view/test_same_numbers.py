"""The viewer's per-environment numbers are the metrics file's and ``gym eval compare``'s.

One task identity everywhere (``_ng_task_index``): on a game environment whose 8 games share one
prompt (guess_number), on a templated one whose rows share a prompt and differ in their verifier
fields (keyword_constraints), and on rows as NeMo Gym writes them (completion order, repeats
interleaved), the Overview shows the task count, mean reward and pass@k that the run's
``_aggregate_metrics.json`` holds and that ``gym eval compare`` reports, and Compare pairs every task.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from polygym import metrics
from polygym.collect.compare import compare
from polygym.view import pages
from polygym.view.app import create_app
from polygym.view.viewer import open_runs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _example(env: str) -> dict[str, Any]:
    line = (ROOT / "resources_servers" / env / "data" / "example.jsonl").read_bytes().splitlines()[0]
    row: dict[str, Any] = orjson.loads(line)
    return row


def _script(*answers: str) -> dict[str, str]:
    return {"script": orjson.dumps([{"answer": a} for a in answers]).decode()}


def guess_rows() -> list[dict[str, Any]]:
    """8 games, one prompt: games 0, 3, 6 are won on the first guess, the others lost."""
    rows = []
    for game in range(8):
        row = _example("guess_number")
        secret = 10 + game
        row["game"] = {"low": 1, "high": 100, "secret": secret, "max_guesses": 3}
        guesses = [secret] if game % 3 == 0 else [50, 60, 70]
        row["responses_create_params"]["metadata"] = _script(*(f"<guess>{g}</guess>" for g in guesses))
        rows.append(row)
    return rows


def keyword_rows() -> list[dict[str, Any]]:
    """6 rows from one template: the same prompt, a different keyword to check in each."""
    rows = []
    for i, keyword in enumerate(("ladder", "river", "ladder", "cloud", "ladder", "stone")):
        row = _example("keyword_constraints")
        row["keyword"] = keyword
        answer = "I climbed the ladder today." if i % 2 == 0 else "I climbed the ladder and the stone."
        row["responses_create_params"]["metadata"] = _script(answer)
        rows.append(row)
    return rows


def eval_run(folder: Path, name: str, env: str, rows: list[dict[str, Any]], repeats: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}_in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    args = ["eval", "run", "--model-type", "scripted_model", "--resources-server", env]
    args += ["--input", f"{name}_in.jsonl", "--output", f"{name}.jsonl", "--num-repeats", str(repeats)]
    done = subprocess.run(
        [sys.executable, "-m", "polygym", *args, "--overwrite"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / f"{name}.jsonl"


def as_nemo_gym_writes(run: Path, out: Path) -> Path:
    """The rollouts in completion order (NeMo Gym appends them as they finish), with the metrics
    file its collector writes beside them (the same statistics, ``polygym.metrics``)."""
    rows = [orjson.loads(line) for line in run.read_bytes().splitlines()]
    random.Random(3).shuffle(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    agent = rows[0]["agent_ref"]
    entry = {"agent_ref": agent, **metrics.aggregate(rows)}
    out.with_name(out.stem + "_aggregate_metrics.json").write_bytes(orjson.dumps([entry]))
    return out


def assert_same_numbers(run: Path) -> None:
    [entry] = orjson.loads(run.with_name(run.stem + "_aggregate_metrics.json").read_bytes())
    written = entry["agent_metrics"]
    env = entry["agent_ref"]["name"]
    [index] = open_runs([run], echo=lambda _: None)
    [shown] = [s for s in pages.overview(index)["summaries"] if s.env == env]
    [cli] = compare(run, run).candidates[0].environments
    cli_values = {m.metric: m.base for m in cli.metrics}
    assert shown.tasks == written["num_tasks"] == cli.paired_tasks
    assert shown.rollouts == written["num_rollouts"]
    assert shown.reward.mean == pytest.approx(written["mean/reward"]) == cli_values["mean/reward"]
    pass_keys = {k for k in written if k.startswith("pass@")}
    assert pass_keys and set(shown.pass_at) == pass_keys
    for key in pass_keys:
        assert shown.pass_at[key] == pytest.approx(written[key]) == cli_values[key], key
    # and the page says so: the compare page pairs every task of the run with itself
    client = TestClient(create_app(open_runs([run, run], echo=lambda _: None), wait_s=60))
    page = client.get("/compare/0/1").text
    assert f'<td class="num">{int(written["num_tasks"])}</td>' in page


def test_game_environment_counts_every_game(tmp_path: Path) -> None:
    run = eval_run(tmp_path, "guess", "guess_number", guess_rows(), repeats=4)
    assert_same_numbers(run)
    [index] = open_runs([run], echo=lambda _: None)
    [shown] = [s for s in pages.overview(index)["summaries"] if s.env == "guess_number_gymnasium_agent"]
    assert shown.tasks == 8 and shown.pass_at["pass@4"] == pytest.approx(3 / 8)


def test_templated_environment_counts_every_row(tmp_path: Path) -> None:
    run = eval_run(tmp_path, "keyword", "keyword_constraints", keyword_rows(), repeats=2)
    assert_same_numbers(run)


def test_rows_as_nemo_gym_writes_them(tmp_path: Path) -> None:
    run = eval_run(tmp_path, "guess", "guess_number", guess_rows(), repeats=4)
    assert_same_numbers(as_nemo_gym_writes(run, tmp_path / "nemo" / "rollouts.jsonl"))
