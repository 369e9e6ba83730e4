"""The order of a plan's jobs: each row's repeats back to back, or round by round (interleaved)."""

from __future__ import annotations

from polygym.collect.job_plan import JobPlan, Materialization


def keys(plan: JobPlan) -> list[tuple[int, int]]:
    return [job.key for job in plan]


def plan(interleave: bool) -> JobPlan:
    """Rows a (2 repeats), b (3 repeats for its agent), a again (a's task, rollouts 2-3)."""
    a, b = ({"responses_create_params": {"input": q}} for q in ("a", "b"))
    rows = [(a, "x"), (b, "y"), (a, "x")]
    return JobPlan.from_rows(rows, Materialization(2, {"y": 3}, interleave=interleave))


def test_repeats_back_to_back_by_default() -> None:
    assert keys(plan(False)) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (0, 2), (0, 3)]


def test_interleaved_repeats_go_round_by_round_with_the_same_keys() -> None:
    assert keys(plan(True)) == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (0, 2), (0, 3)]
    assert sorted(keys(plan(True))) == sorted(keys(plan(False)))


def test_interleaving_changes_the_fingerprint_only_when_on() -> None:
    assert plan(True).fingerprint() != plan(False).fingerprint()
    assert plan(False).fingerprint() == JobPlan(plan(False).rows, {}, None).fingerprint()
