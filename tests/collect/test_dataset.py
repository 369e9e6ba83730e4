"""Row validation (file:line: field: problem), task/rollout indices, repeats and limit, the lazy plan."""

import itertools
import tracemalloc
from pathlib import Path

import orjson
import pytest

from polygym.collect.dataset import DatasetError, load_jobs
from polygym.collect.job_plan import MAX_NUM_REPEATS, Materialization

AGENTS = ["weather_agent", "synonym_agent"]


def row(text: str, agent: str | None = "weather_agent", **extra: object) -> dict:
    data: dict = {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **extra}
    if agent is not None:
        data["agent_ref"] = {"type": "responses_api_agents", "name": agent}
    return data


def write(tmp_path: Path, lines: list) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_bytes(
        b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)
    )
    return path


def test_identical_rows_share_task_index_and_repeats_are_consecutive(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a"), row("b"), row("a")])
    jobs = list(load_jobs(path, AGENTS, options=Materialization(num_repeats=2)))
    assert [j.key for j in jobs] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]
    assert jobs[0].row["_ng_task_index"] == 0 and jobs[1].row["_ng_rollout_index"] == 1
    assert jobs[0].row["agent_ref"] == {"type": "responses_api_agents", "name": "weather_agent"}


def test_limit_counts_rows_before_repeats(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a"), row("b"), row("c")])
    jobs = list(load_jobs(path, AGENTS, limit=2, options=Materialization(num_repeats=3)))
    assert len(jobs) == 6 and {j.task_index for j in jobs} == {0, 1}


def test_per_agent_repeats_sampling_and_seed(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a"), row("b", agent="synonym_agent")])
    options = Materialization(1, {"synonym_agent": 3}, {"temperature": 0.5}, seed=10)
    jobs = list(load_jobs(path, AGENTS, options=options))
    assert [j.agent for j in jobs] == ["weather_agent"] + ["synonym_agent"] * 3
    params = [j.row["responses_create_params"] for j in jobs]
    assert all(p["temperature"] == 0.5 for p in params)
    assert [p["seed"] for p in params] == [10, 10, 11, 12]


def test_unknown_fields_pass_through(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a", expected_city="Oslo", custom={"x": [1]})])
    [job] = load_jobs(path, AGENTS)
    assert job.row["expected_city"] == "Oslo" and job.row["custom"] == {"x": [1]}


def test_every_bad_row_is_reported_with_file_line_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            row("fine"),
            b"{not json",
            {"agent_ref": {"type": "responses_api_agents", "name": "weather_agent"}},
            row("x", agent="wether_agent"),
            {"responses_create_params": {"input": {"role": "user"}}, "agent_ref": {"name": "weather_agent"}},
            [1, 2],
            row("y", agent=None),
            {"responses_create_params": {"input": "hi", "tools": [{"description": "no name"}]}},
        ],
    )
    with pytest.raises(DatasetError) as info:
        load_jobs(path, AGENTS)
    message = str(info.value)
    assert f"{path}:2: (row): invalid JSON" in message
    assert f"{path}:3: responses_create_params: missing" in message
    assert f"{path}:4: agent_ref.name: unknown agent 'wether_agent'. Did you mean 'weather_agent'?" in message
    assert (
        f"{path}:5: responses_create_params.input: must be a string or a list of items, got dict" in message
    )
    assert f"{path}:6: (row): must be a JSON object" in message
    assert f"{path}:7: agent_ref: missing, and no --agent default given" in message
    assert f"{path}:8: responses_create_params.tools[0]: must be an object with a 'name'" in message
    assert f"{path}:8: agent_ref: missing" in message
    assert ":1:" not in message


def test_default_agent_routes_rows_without_agent_ref(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a", agent=None)])
    [job] = load_jobs(path, AGENTS, default_agent="synonym_agent")
    assert job.agent == "synonym_agent"


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_jobs(tmp_path / "nope.jsonl", AGENTS)
    with pytest.raises(DatasetError, match=f"{tmp_path}: is a directory, not a JSONL file"):
        load_jobs(tmp_path, AGENTS)
    with pytest.raises(DatasetError, match="no rows"):
        load_jobs(write(tmp_path, []), AGENTS)


def test_sampling_fields_are_checked_before_any_rollout(tmp_path: Path) -> None:
    """A value the model server would refuse is found up front, with file, line and field."""
    bad = [
        {"temperature": "hot"},
        {"top_p": 1.5},
        {"max_output_tokens": 0},
        {"max_output_tokens": 2.5},
        {"temperature": True},
        {"parallel_tool_calls": "yes"},
    ]
    lines = [row("fine", temperature=None)]
    for params in bad:
        data = row("q")
        data["responses_create_params"].update(params)
        lines.append(data)
    lines[0]["responses_create_params"].update(temperature=0.7, top_p=None, seed=3, max_output_tokens=16)
    path = write(tmp_path, lines)
    with pytest.raises(DatasetError) as info:
        load_jobs(path, AGENTS)
    message = str(info.value)
    assert f"{path}:2: responses_create_params.temperature: must be a number from 0 to 2, got 'hot'" in (
        message
    )
    assert f"{path}:3: responses_create_params.top_p: must be a number from 0 to 1, got 1.5" in message
    assert f"{path}:4: responses_create_params.max_output_tokens: must be an integer of at least 1" in message
    assert f"{path}:5: responses_create_params.max_output_tokens: must be an integer" in message
    assert f"{path}:6: responses_create_params.temperature: must be a number" in message
    assert f"{path}:7: responses_create_params.parallel_tool_calls: must be true or false" in message
    assert ":1:" not in message


def test_the_plan_expands_repeats_lazily_and_answers_without_expanding(tmp_path: Path) -> None:
    """A million repeats cost the rows, not the jobs: counting and looking up never build a job."""
    path = write(tmp_path, [row("a"), row("b", agent="synonym_agent"), row("a")])
    tracemalloc.start()
    try:
        plan = load_jobs(path, AGENTS, options=Materialization(num_repeats=MAX_NUM_REPEATS))
        assert len(plan) == 3 * MAX_NUM_REPEATS
        assert plan.totals() == {"weather_agent": 2 * MAX_NUM_REPEATS, "synonym_agent": MAX_NUM_REPEATS}
        assert plan.agent_of((0, 2 * MAX_NUM_REPEATS - 1)) == "weather_agent"
        assert plan.agent_of((0, 2 * MAX_NUM_REPEATS)) is None and plan.agent_of((2, 0)) is None
        first = list(itertools.islice(plan, 3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [j.key for j in first] == [(0, 0), (0, 1), (0, 2)]
    assert peak < 1_000_000  # 300,000 jobs as a list would be over 100 MB


def test_the_fingerprint_changes_with_any_job(tmp_path: Path) -> None:
    path = write(tmp_path, [row("a"), row("b")])
    base = load_jobs(path, AGENTS).fingerprint()
    assert load_jobs(path, AGENTS).fingerprint() == base
    changed = [
        load_jobs(path, AGENTS, options=Materialization(num_repeats=2)),
        load_jobs(path, AGENTS, limit=1),
        load_jobs(path, AGENTS, options=Materialization(sampling={"temperature": 0.5})),
        load_jobs(path, AGENTS, options=Materialization(seed=1)),
        load_jobs(write(tmp_path, [row("a"), row("c")]), AGENTS),
    ]
    assert len({plan.fingerprint() for plan in changed} | {base}) == len(changed) + 1


def test_repeats_are_bounded() -> None:
    with pytest.raises(ValueError, match=f"must be from 1 to {MAX_NUM_REPEATS}"):
        Materialization(num_repeats=MAX_NUM_REPEATS + 1)
    with pytest.raises(ValueError, match="repeats for weather_agent"):
        Materialization(repeats_by_agent={"weather_agent": 0})


def test_an_empty_input_list_is_a_row_as_nemo_gym_reads_it(tmp_path: Path) -> None:
    path = write(
        tmp_path, [{"responses_create_params": {"input": []}, "agent_ref": {"name": "weather_agent"}}]
    )
    [job] = load_jobs(path, AGENTS)
    assert job.row["responses_create_params"]["input"] == []
