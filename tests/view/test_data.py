"""The viewer's data layer: discovering runs, tailing a growing file, indexing, filtering, CIs, flips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.collect.statistics import mean_interval as estimate
from polygym.row import ALL_ENVS
from polygym.view.conversation import MAX_TEXT, conversation, count_turns
from polygym.view.index import open_index
from polygym.view.query import QueryError, page_of, parse_filter, select
from polygym.view.runs import RunNotFoundError, discover
from polygym.view.stats import compare_indexes, env_tasks, flips, rollup, rows_by_env, summarize
from polygym.view.tail import JsonlTail


def rollout(env: str, task: int, repeat: int, reward: float, text: str = "hi") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": f"task {task}"},
        "response": {
            "output": [
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": 1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
            ],
            "usage": {"total_tokens": 10 + task},
        },
        "reward": reward,
        "agent_ref": {"type": "responses_api_agents", "name": env},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
    }


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def failure(env: str, task: int, error_class: str) -> dict[str, Any]:
    return {
        "agent_ref": {"name": env},
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
        "error_class": error_class,
        "error": "boom",
        "latency_s": 2.5,
        "row": {"responses_create_params": {"input": f"task {task}"}},
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    rows = [rollout("a", t, r, 1.0 if t < 2 else 0.0) for t in range(4) for r in range(2)]
    rows += [rollout("b", t, 0, 0.5, text="<script>alert(1)</script>") for t in range(3)]
    write(tmp_path / "run.jsonl", rows)
    write(tmp_path / "run_failures.jsonl", [failure("b", 9, "Timeout"), failure("a", 8, "HTTP 500")])
    return tmp_path / "run.jsonl"


def test_discover_from_any_sibling_and_train_folder(run: Path, tmp_path: Path) -> None:
    assert discover(run.with_name("run_failures.jsonl")).rollouts == run
    assert discover(run).kind == "eval"
    write(run.with_name("run_steps.jsonl"), [{"step": 0, "env": "a"}])
    assert discover(run).kind == "steps"
    train = tmp_path / "train"
    write(train / "train_log.jsonl", [])
    assert discover(train).kind == "train"
    with pytest.raises(RunNotFoundError, match="no such run"):
        discover(tmp_path / "nope.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunNotFoundError, match=r"train_log\.jsonl"):
        discover(tmp_path / "empty")


def test_tail_reads_complete_lines_only_and_skips_overlong(tmp_path: Path) -> None:
    path = tmp_path / "grow.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2')
    tail = JsonlTail(path, max_line=64)
    assert [line.raw for line in tail.read_new()] == [b'{"a": 1}\n']
    with path.open("ab") as handle:
        handle.write(b'}\n{"long": "' + b"x" * 100)
    assert [line.raw for line in tail.read_new()] == [b'{"a": 2}\n']
    with path.open("ab") as handle:
        handle.write(b'"}\n{"a": 3}\n')
    assert [line.raw for line in tail.read_new()] == [b'{"a": 3}\n']
    assert tail.skipped == 1
    path.write_bytes(b'{"b": 1}\n')  # started over
    assert [line.raw for line in tail.read_new()] == [b'{"b": 1}\n'] and tail.generation == 1


def test_index_columns_and_rows_read_back_by_offset(run: Path) -> None:
    index = open_index(discover(run))
    assert len(index) == 13
    assert sorted(index.envs) == ["a", "b"]
    assert sum(index.failed) == 2 and sorted(index.classes) == ["HTTP 500", "Timeout"]
    assert index.turns[0] == 2 and index.tokens[0] == 10
    assert index.row(12)["error_class"] == "HTTP 500"
    assert index.row(3)["_ng_task_index"] == 1
    # the two repeats of a task share its key; different tasks do not
    assert index.task_key_of(0) == index.task_key_of(1) != index.task_key_of(2)
    with run.open("ab") as handle:
        handle.write(orjson.dumps(rollout("c", 0, 0, 1.0)) + b"\n")
    assert index.refresh() == 1 and index.envs[index.env[13]] == "c"


def test_filters_narrow_and_page(run: Path) -> None:
    index = open_index(discover(run))
    assert len(select(index, parse_filter({"env": "b"}))) == 4
    assert len(select(index, parse_filter({"status": "failed"}))) == 2
    assert select(index, parse_filter({"class": "Timeout"})) == [11]
    assert len(select(index, parse_filter({"min": "0.4", "max": "0.6"}))) == 3
    assert len(select(index, parse_filter({"q": "<SCRIPT>alert"}))) == 3
    assert select(index, parse_filter({"q": "no such text"})) == []
    assert select(index, parse_filter({"task": index.task_key_of(0)})) == [0, 1]
    page = page_of(list(range(13)), 9, 5)
    assert page.number == 3 and page.rows == [10, 11, 12] and page.pages == 3
    for bad in ({"status": "nope"}, {"min": "x"}, {"min": "nan"}, {"q": "x" * 201}, {"step": "1e3"}):
        with pytest.raises(QueryError):
            parse_filter(bad)


def test_ci_is_over_task_means() -> None:
    est = estimate([1.0, 0.0] * 4)
    assert est.mean == 0.5 and est.low is not None and est.high is not None
    assert est.high - est.low == pytest.approx(2 * 1.959964 * (0.5345224838248488 / 8**0.5), rel=1e-6)
    assert estimate([1.0]).low is None and estimate([]).mean is None


def test_ci_never_leaves_the_range_of_the_task_means() -> None:
    est = estimate([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # normal approximation: about [0.53, 1.14]
    assert est.high == 1.0 and est.low is not None and 0.5 < est.low < est.mean


def test_summary_per_env(run: Path) -> None:
    index = open_index(discover(run))
    rows, tasks = rows_by_env(index), env_tasks(index)
    a = summarize(index, "a", rows["a"], tasks["a"], None)
    assert a.rollouts == 8 and a.failures == 1 and a.failures_by_class == {"HTTP 500": 1}
    assert a.reward.mean == 0.5 and a.reward.n == 4 and a.tasks == 4
    assert a.pass_at["pass@1"] == 0.5 and a.pass_at["pass@2"] == 0.5
    assert a.latency == {}  # failures' latency alone would mislead: only the metrics file's is shown
    b = summarize(index, "b", rows["b"], tasks["b"], {"p50": 0.1})
    assert b.latency == {"p50": 0.1} and b.reward.mean == 0.5
    # the (all) row: each environment counts once (a: 8 rollouts, b: 3), counts are sums
    both = rollup(index, [a, b])
    assert both.env == ALL_ENVS and both.reward.mean == 0.5 and both.rollouts == 11 and both.failures == 2
    # b: reward 0.5 never passes; its tasks have one rollout each, so no pass@2 for every environment
    assert both.pass_at == {"pass@1": 0.25, "pass@1[avg-of-k]": 0.25}


def test_compare_pairs_tasks_and_finds_flips(run: Path, tmp_path: Path) -> None:
    # new run: task 0 of env a now fails, task 3 now passes
    rows = [rollout("a", t, r, 1.0 if t in (1, 3) else 0.0) for t in range(4) for r in range(2)]
    rows += [rollout("b", t, 0, 0.5) for t in range(3)]
    write(tmp_path / "new" / "run.jsonl", rows)
    base, new = open_index(discover(run)), open_index(discover(tmp_path / "new" / "run.jsonl"))
    result = compare_indexes(base, new)
    envs = {e.env: e for e in result.candidates[0].environments}
    reward = {e: next(m for m in envs[e].metrics if m.metric == "mean/reward") for e in envs}
    assert envs["a"].paired_tasks == 4 and reward["a"].delta == 0.0
    assert reward["b"].delta == 0.0 and reward["b"].low == 0.0
    found = flips(base, new, result)
    assert [(f.env, f.now_solved) for f in found] == [("a", False), ("a", True)]
    assert base.row(found[0].base_rows[0])["_ng_task_index"] == 0
    assert new.row(found[1].new_rows[0])["_ng_task_index"] == 3


def test_conversation_joins_calls_to_outputs_and_cuts_long_text() -> None:
    row = rollout("a", 0, 0, 1.0, text="y" * (MAX_TEXT + 5))
    blocks = conversation(row)
    assert [b.kind for b in blocks] == ["message", "tool", "message"]
    assert blocks[0].role == "user" and blocks[0].text == "task 0"
    assert blocks[1].name == "lookup" and blocks[1].output == "42" and '"q": 1' in blocks[1].arguments
    assert blocks[2].cut == 5 and len(blocks[2].text) == MAX_TEXT
    assert count_turns(row["response"]) == 2
    orphan = conversation(
        {"response": {"output": [{"type": "function_call_output", "call_id": "x", "output": 1}]}}
    )
    assert orphan[0].kind == "tool" and orphan[0].output == "1"


def test_text_search_finds_words_across_read_chunks(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polygym.view import query

    index = open_index(discover(run))
    expected = select(index, parse_filter({"q": "alert(1)"}))
    monkeypatch.setattr(query, "CHUNK", 7)  # every match now straddles chunk boundaries
    query._searches.clear()
    assert select(index, parse_filter({"q": "ALERT(1)"})) == expected and len(expected) == 3


def test_steps_later_line_wins_and_validation_per_agent(tmp_path: Path) -> None:
    from polygym.view.steps import read_steps, read_validation

    log = tmp_path / "train_log.jsonl"
    write(
        log,
        [
            {"step": 0, "env": "a", "reward_mean": 0.1, "target_share": 0.5, "realized_share": 0.4},
            {"step": 1, "env": "a", "reward_mean": 0.2},
            {"step": 0, "env": "a", "reward_mean": 0.3},  # step 0 collected again after a resume
            {"step": 0, "env": ALL_ENVS, "reward_mean": 0.3},
        ],
    )
    series = read_steps(log)
    assert list(series) == ["a", ALL_ENVS]
    assert series["a"].steps == [0, 1] and series["a"].values["reward_mean"] == [0.3, 0.2]
    assert series["a"].values["target_share"] == [None, None]
    metrics = tmp_path / "validation_before_aggregate_metrics.json"
    metrics.write_bytes(orjson.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.25}}]))
    assert read_validation({"validation_before": metrics}) == {"validation_before": {"a": 0.25}}
