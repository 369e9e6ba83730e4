"""The viewer's statistics are ``polygym.collect.statistics``' own, fed from a run's index."""

from __future__ import annotations

from pathlib import Path

from polygym.collect import statistics
from polygym.view.index import open_index
from polygym.view.runs import discover
from polygym.view.stats import compare_envs, env_rows, flips, task_means
from tests.view.test_data import rollout, write


def test_viewer_deltas_and_flips_come_from_the_shared_module(tmp_path: Path) -> None:
    base_rows = [rollout("a", t, r, 1.0 if t % 2 else 0.0) for t in range(12) for r in range(2)]
    new_rows = [rollout("a", t, r, 1.0 if t % 3 == 0 else 0.0) for t in range(12) for r in range(2)]
    write(tmp_path / "base" / "run.jsonl", base_rows)
    write(tmp_path / "new" / "run.jsonl", new_rows)
    base = open_index(discover(tmp_path / "base" / "run.jsonl"))
    new = open_index(discover(tmp_path / "new" / "run.jsonl"))
    a, b = task_means(base, env_rows(base)["a"]), task_means(new, env_rows(new)["a"])
    shown = next(d for d in compare_envs(base, new) if d.env == "a")
    assert shown.delta == statistics.delta(a, b) and shown.delta.method == statistics.PAIRED
    mean, low = shown.delta.mean, shown.delta.low
    assert shown.paired == 12 and mean is not None and low is not None and low < mean
    found = flips(base, new)
    # tasks 0, 6 gained (solved only in new); 1, 5, 7, 11 lost; 3, 9 solved in both
    assert sum(not f.now_solved for f in found) == 4 and sum(f.now_solved for f in found) == 2
    assert [f.now_solved for f in found] == [False] * 4 + [True] * 2  # losses first
