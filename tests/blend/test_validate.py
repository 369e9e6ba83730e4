"""Rows checked against the verifiers of the environments they target."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import parse_spec
from polygym.blend.validate import validate_files
from polygym.collect.dataset import DatasetError
from tests.blend.helpers import ENVS, example, write


def test_rows_missing_verifier_fields_stop_the_load(tmp_path: Path) -> None:
    rows = [orjson.loads(line) for line in example(ENVS[1]).read_bytes().splitlines()]
    del rows[2]["expected_synonym_values"]
    data = write(tmp_path / "w.jsonl", "".join(orjson.dumps(r).decode() + "\n" for r in rows))
    spec = parse_spec(
        {"environments": [{"name": ENVS[1], "train": str(data)}], "prompts_per_step": 2}, "inline", tmp_path
    )
    with pytest.raises(DatasetError) as info:
        load_blend(spec)
    assert info.value.problems == [
        f"{data}:3: expected_synonym_values: missing (required by the example_multi_step verifier)"
    ]


def test_validate_files_counts_per_environment() -> None:
    report = validate_files([example(ENVS[0]), example(ENVS[1])])
    assert report.problems == [] and report.rows == 10
    stats = {s.env: s.to_dict() for s in report.stats}
    assert stats[ENVS[0]]["rows"] == 5 and stats[ENVS[0]]["tools"] == ["get_weather"]
    assert stats[ENVS[1]]["tools"] == ["extract_synonym_values", "get_synonym_value"]
    assert stats[ENVS[0]]["turns"] == {"min": 2, "mean": 2.0, "max": 2}
    assert stats[ENVS[0]]["est_tokens"]["min"] > 0


def test_a_nemo_gym_environment_is_not_imported_its_rows_get_the_generic_checks(
    fake_nemo_gym_env: dict[str, str], tmp_path: Path
) -> None:
    good = {"responses_create_params": {"input": []}, "agent_ref": fake_nemo_gym_env, "any_field": 1}
    lines = [orjson.dumps(good).decode(), orjson.dumps({"agent_ref": fake_nemo_gym_env}).decode()]
    data = write(tmp_path / "rows.jsonl", "\n".join(lines) + "\n")
    report = validate_files([data], ["ng_env"])
    assert report.problems == [f"{data}:2: responses_create_params: missing"]
    assert report.notes == [
        "ng_env_simple_agent: ng_env is a NeMo Gym server: its rows got the generic checks only "
        "(responses_create_params, agent_ref); its own row schema is checked by the server at run time"
    ]


def test_a_named_environment_whose_config_does_not_load_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "unknown environment": only the named environments are loaded, and this one is broken."""
    folder = tmp_path / "resources_servers" / "zz_bad_config"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "zz_bad_config.yaml").write_text(
        "config_paths: [no/such/file.yaml]\n"
        "zz_bad_config:\n  resources_servers:\n    zz_bad_config:\n      key: 1\n"
    )
    monkeypatch.chdir(tmp_path)
    data = write(tmp_path / "rows.jsonl", '{"responses_create_params": {"input": "hi"}}\n')
    problem = validate_files([data], ["zz_bad_config"]).problems[0]
    assert problem.startswith("--env zz_bad_config: its config does not load:")
    assert "config_paths entry 'no/such/file.yaml' not found" in problem


def test_materialized_task_rows_get_their_envelope_checked_and_a_note(tmp_path: Path) -> None:
    """A taskset routes in the stack that runs it, so its rows are not tied to an environment here."""
    good = {"task_id": {"taskset": "weather", "task_id": "t1"}, "task_input": {"task_data": {}}}
    bad = {"task_id": {"taskset": "weather"}, "task_input": {}}
    data = write(tmp_path / "tasks.jsonl", "".join(orjson.dumps(r).decode() + "\n" for r in (good, bad)))
    report = validate_files([data], [ENVS[0]])
    assert report.problems == [f"{data}:2: task_id.task_id: must be a non-empty string"]
    assert report.rows == 2 and any(note.startswith("2 materialized task rows") for note in report.notes)


def test_a_blend_refuses_materialized_task_rows_naming_the_line(tmp_path: Path) -> None:
    """A blend sends every row of an environment to its agent; a task belongs to its taskset's server."""
    task = {"task_id": {"taskset": "weather", "task_id": "t1"}, "task_input": {"task_data": {}}}
    data = write(tmp_path / "tasks.jsonl", orjson.dumps(task).decode() + "\n")
    spec = parse_spec(
        {"environments": [{"name": ENVS[0], "train": str(data)}], "prompts_per_step": 1}, "inline", tmp_path
    )
    with pytest.raises(DatasetError) as info:
        load_blend(spec)
    assert info.value.problems[0].startswith(f"{data}:1: a materialized task row")
