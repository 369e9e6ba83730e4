"""The viewer's statistics are ``gym eval compare``'s own, fed from a run's index."""

from __future__ import annotations

from pathlib import Path

from polygym.collect.compare import compare
from polygym.view.index import open_index
from polygym.view.runs import discover
from polygym.view.stats import compare_indexes, flips
from tests.view.test_data import rollout, write


def test_viewer_comparison_is_gym_eval_compare_on_the_same_files(tmp_path: Path) -> None:
    base_rows = [rollout("a", t, r, 1.0 if t % 2 else 0.0) for t in range(12) for r in range(2)]
    new_rows = [rollout("a", t, r, 1.0 if t % 3 == 0 else 0.0) for t in range(12) for r in range(2)]
    write(tmp_path / "base" / "run.jsonl", base_rows)
    write(tmp_path / "new" / "run.jsonl", new_rows)
    base = open_index(discover(tmp_path / "base" / "run.jsonl"))
    new = open_index(discover(tmp_path / "new" / "run.jsonl"))
    shown = compare_indexes(base, new).candidates[0]
    cli = compare(tmp_path / "base" / "run.jsonl", tmp_path / "new" / "run.jsonl").candidates[0]
    assert [e.metrics for e in shown.environments] == [e.metrics for e in cli.environments]
    env = shown.environments[0]
    reward = next(m for m in env.metrics if m.metric == "mean/reward")
    assert env.paired_tasks == 12 and reward.low is not None and reward.delta is not None
    assert reward.low < reward.delta and reward.method == "paired-bootstrap"
    found = flips(base, new, compare_indexes(base, new))
    # tasks 0, 6 gained (solved only in new); 1, 5, 7, 11 lost; 3, 9 solved in both
    assert sum(not f.now_solved for f in found) == 4 and sum(f.now_solved for f in found) == 2
    assert [f.now_solved for f in found] == [False] * 4 + [True] * 2  # losses first
