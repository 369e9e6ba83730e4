"""The training view follows a ``gym train run`` folder while it is written: every validation point,
the rollouts behind each, planned vs realized shares, and alarms as they fire."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from starlette.testclient import TestClient

from polygym.view.app import create_app
from polygym.view.viewer import find_runs
from tests.view.train_run import STEPS, XSS, grow


def _figures(page: str) -> list[dict[str, object]]:
    found = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, flags=re.S)
    return [orjson.loads(text) for text in found]


def test_training_view_follows_the_run_as_it_goes(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    done = grow(folder, 0, 12)
    client = TestClient(create_app(find_runs([folder]), wait_s=60))
    page = client.get("/run/0/training").text
    assert "running" in page and 'data-step="0"' in page and 'data-step="8"' in page
    assert 'data-step="16"' not in page
    # the masked-share alarm of step 5, and no regression yet (the watched env holds until 8)
    assert "step 5 · guess_number · masked share" in page and "· validation regression" not in page
    curves, shares, _ = _figures(page)
    assert [t["name"] for t in curves["data"]] == ["arithmetic", "guess_number", "mcqa (watched)"]
    assert all(t["x"] == [0, 8] for t in curves["data"])
    assert any(t["name"] == "arithmetic planned" for t in shares["data"])
    version = client.get("/run/0/count.json").json()["version"]

    grow(folder, done, STEPS)
    assert client.get("/run/0/count.json").json()["version"] != version  # the open page reloads
    page = client.get("/run/0/training").text
    assert "ended" in page and 'data-step="24"' in page
    curves = _figures(page)[0]
    *lines, alarms = curves["data"]
    assert all(t["x"] == [0, 8, 16, 24] for t in lines)
    assert alarms["name"] == "regression alarm" and alarms["x"] == [16, 24] and alarms["text"] == ["mcqa"] * 2
    # mcqa forgot after step 8: an alarm at 16 and at 24, at the run's own limit (run.json)
    assert re.findall(r"step (\d+) · (\w+) · validation regression", page) == [("16", "mcqa"), ("24", "mcqa")]
    assert "more than --max-regression 0.05" in page  # the limit the run set, in the trainer's own alarm line
    # every point links to its rollouts, which are escaped like every page
    link = re.search(r'<tr data-step="16">.*?href="(/run/(\d+)/rollouts\?env=mcqa)"', page, flags=re.S)
    assert link is not None
    rows = client.get(link.group(1)).text
    assert "32 of 96 rows" in rows
    before = re.search(r'<tr data-step="0">.*?href="/run/(\d+)/rollouts\?env=arithmetic"', page, flags=re.S)
    assert before is not None
    listing = client.get(f"/run/{before.group(1)}/rollouts?q=onerror").text
    number = re.search(r'data-row="(\d+)"', listing)
    assert number is not None
    shown = client.get(f"/run/{before.group(1)}/rollouts/{number.group(1)}").text
    assert XSS not in shown and "&lt;script&gt;alert(" in shown


def test_a_running_run_alarms_at_its_own_limit_before_its_summary(tmp_path: Path) -> None:
    """The limits come from run.json, written at the start: no summary.json yet, and the alarm of
    step 16 is at the run's --max-regression 0.05, for mcqa only (no guessed limit elsewhere)."""
    folder = tmp_path / "train"
    grow(folder, 0, 17)
    assert (folder / "run.json").is_file() and not (folder / "summary.json").exists()
    page = TestClient(create_app(find_runs([folder]), wait_s=60)).get("/run/0/training").text
    assert "running" in page
    assert re.findall(r"step (\d+) · (\w+) · validation regression", page) == [("16", "mcqa")]
    assert "more than --max-regression 0.05" in page and "--max-regression 0.02" not in page


def test_a_folder_without_its_run_record_raises_no_regression_alarm(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    grow(folder, 0, 17)
    (folder / "run.json").unlink()
    page = TestClient(create_app(find_runs([folder]), wait_s=60)).get("/run/0/training").text
    assert 'data-step="16"' in page and "· validation regression" not in page


def test_a_watch_folder_with_only_validation_curves_is_a_training_run(tmp_path: Path) -> None:
    folder = tmp_path / "watch"
    folder.mkdir()
    (folder / "validation.jsonl").write_bytes(
        orjson.dumps({"step": 0, "env": "<b>env</b>", "eval_only": True, "reward_mean": 0.5, "n": 4}) + b"\n"
    )
    client = TestClient(create_app(find_runs([folder]), wait_s=60))
    page = client.get("/run/0/training").text
    assert "&lt;b&gt;env&lt;/b&gt; <span" in page and "<b>env</b>" not in page
    assert "no rollouts file (yet)" in page  # no rollouts file behind the point
