"""Blend specs: loading, clear errors naming file and key, finding each environment's data."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from polygym.blend.mix import (
    BlendSpecError,
    load_blend,
    load_spec,
    parse_spec,
    resolve,
    spec_from_flags,
    validate_files,
)
from polygym.collect.dataset import DatasetError
from tests.conftest import ROOT

ENVS = ("example_single_tool_call", "example_multi_step")


def example(env: str) -> Path:
    return ROOT / "resources_servers" / env / "data" / "example.jsonl"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(BlendSpecError) as info:
        resolve(load_spec(path))
    return info.value.problems


def test_list_and_map_forms_are_the_same_spec(tmp_path: Path) -> None:
    as_list = write(
        tmp_path / "list.yaml",
        """
environments:
  - {name: example_single_tool_call, weight: 3}
  - {name: example_multi_step, min_per_step: 1}
prompts_per_step: 4
responses_per_prompt: 2
seed: 5
""",
    )
    as_map = write(
        tmp_path / "map.yaml",
        """
environments:
  example_single_tool_call: {weight: 3}
  example_multi_step: {min_per_step: 1}
prompts_per_step: 4
responses_per_prompt: 2
seed: 5
""",
    )
    first, second = load_spec(as_list), load_spec(as_map)
    assert first.model_dump() == second.model_dump()
    assert [e.agent_name for e in first.environments] == [f"{e}_simple_agent" for e in ENVS]
    assert first.environments[1].weight == 1.0
    assert first.global_batch_size == 8
    resolved = resolve(first)
    # no train files given: each environment's configured datasets
    assert [r.train for r in resolved] == [[example(e)] for e in ENVS]
    assert [r.validation for r in resolved] == [[], []]


def test_problems_name_the_file_and_key_all_at_once(tmp_path: Path) -> None:
    spec = write(
        tmp_path / "bad.yaml",
        """
environments:
  - {name: example_single_tool_call, wieght: 2}
  - {name: example_multi_step, weight: 0, min_per_step: -1}
prompts_per_stp: 4
""",
    )
    with pytest.raises(BlendSpecError) as info:
        load_spec(spec)
    problems = info.value.problems
    assert f"{spec}: prompts_per_step: required" in problems
    assert any(
        p.startswith(f"{spec}: environments[0].wieght: unknown key. Did you mean 'weight'?") for p in problems
    )
    assert f"{spec}: environments[1].weight: Input should be greater than 0" in problems
    assert f"{spec}: environments[1].min_per_step: Input should be greater than or equal to 0" in problems
    assert any(
        p.startswith(f"{spec}: prompts_per_stp: unknown key. Did you mean 'prompts_per_step'?")
        for p in problems
    )
    assert str(info.value).startswith("5 blend spec problems:")


def test_map_form_errors_use_the_environment_name(tmp_path: Path) -> None:
    spec = write(
        tmp_path / "s.yaml", "environments:\n  example_multi_step: {weight: -2}\nprompts_per_step: 2\n"
    )
    with pytest.raises(BlendSpecError) as info:
        load_spec(spec)
    assert info.value.problems == [
        f"{spec}: environments.example_multi_step.weight: Input should be greater than 0"
    ]


def test_duplicates_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    dup = write(
        tmp_path / "dup.yaml",
        "environments: [{name: a, train: x}, {name: a, train: y}]\nprompts_per_step: 2\n",
    )
    with pytest.raises(
        BlendSpecError, match=f"{dup}: environments: environment names must be unique, repeated: a"
    ):
        load_spec(dup)
    broken = write(tmp_path / "broken.yaml", "environments: [\n")
    with pytest.raises(BlendSpecError, match=f"{broken}: invalid YAML"):
        load_spec(broken)
    with pytest.raises(BlendSpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(BlendSpecError, match="must be a mapping"):
        parse_spec(["x"], "inline", tmp_path)


def test_data_paths_resolve_against_the_spec_folder_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_dir = tmp_path / "specs"
    write(spec_dir / "data" / "mine.jsonl", example(ENVS[0]).read_text())
    write(tmp_path / "work" / "cwd_only.jsonl", example(ENVS[1]).read_text())
    monkeypatch.chdir(tmp_path / "work")
    spec = write(
        spec_dir / "blend.yaml",
        """
environments:
  - name: example_single_tool_call
    train: data/mine.jsonl
  - name: example_multi_step
    train: [cwd_only.jsonl]
    validation: [missing.jsonl]
  - name: not_an_env
    train: [data/mine.jsonl]
    agent: custom_agent
prompts_per_step: 3
""",
    )
    problems = problems_of(spec)
    assert len(problems) == 1
    assert problems[0].startswith(
        f"{spec}: environments[1] (example_multi_step).validation[0]: "
        "file not found: missing.jsonl (looked in"
    )
    fixed = write(spec_dir / "ok.yaml", spec.read_text().replace("    validation: [missing.jsonl]\n", ""))
    resolved = resolve(load_spec(fixed))
    assert resolved[0].train == [spec_dir / "data" / "mine.jsonl"]
    assert resolved[1].train == [Path.cwd() / "cwd_only.jsonl"]
    assert resolved[2].agent == "custom_agent" and resolved[2].environment is None


def test_unknown_environment_and_agent_get_suggestions(tmp_path: Path) -> None:
    spec = write(
        tmp_path / "s.yaml",
        """
environments:
  - name: example_multi_stp
  - name: example_single_tool_call
    agent: example_single_tool_call_agent
prompts_per_step: 2
""",
    )
    problems = problems_of(spec)
    assert "environments[0] (example_multi_stp): no train files given and" in problems[0]
    assert "Did you mean 'example_multi_step'?" in problems[0]
    assert (
        "environments[1] (example_single_tool_call).agent: unknown agent 'example_single_tool_call_agent'"
        in (problems[1])
    )
    assert "Did you mean 'example_single_tool_call_simple_agent'?" in problems[1]


def test_flags_form_reads_configured_datasets() -> None:
    spec = spec_from_flags(["example_single_tool_call=3", "example_multi_step"], prompts_per_step=4)
    assert [(e.name, e.weight) for e in spec.environments] == [(ENVS[0], 3.0), (ENVS[1], 1.0)]
    blend = load_blend(spec)
    assert {env: len(rows) for env, rows in blend.rows.items()} == {ENVS[0]: 5, ENVS[1]: 5}
    assert blend.plan().quotas == {ENVS[0]: 3, ENVS[1]: 1}
    with pytest.raises(BlendSpecError, match="WEIGHT must be a number"):
        spec_from_flags(["example_multi_step=heavy"])
    with pytest.raises(
        BlendSpecError, match=r"--env: environments\[0\].weight: Input should be greater than 0"
    ):
        spec_from_flags(["example_multi_step=0"])


def test_rows_missing_verifier_fields_stop_the_load(tmp_path: Path) -> None:
    rows = [orjson.loads(line) for line in example(ENVS[0]).read_bytes().splitlines()]
    del rows[2]["expected_city"]
    data = write(tmp_path / "w.jsonl", "".join(orjson.dumps(r).decode() + "\n" for r in rows))
    spec = parse_spec(
        {"environments": [{"name": ENVS[0], "train": str(data)}], "prompts_per_step": 2}, "inline", tmp_path
    )
    with pytest.raises(DatasetError) as info:
        load_blend(spec)
    assert info.value.problems == [
        f"{data}:3: expected_city: missing (required by the example_single_tool_call verifier)"
    ]


def test_validate_files_counts_per_environment() -> None:
    report = validate_files([example(ENVS[0]), example(ENVS[1])])
    assert report.problems == [] and report.rows == 10
    stats = {s.env: s.to_dict() for s in report.stats}
    assert stats[ENVS[0]]["rows"] == 5 and stats[ENVS[0]]["tools"] == ["get_weather"]
    assert stats[ENVS[1]]["tools"] == ["extract_synonym_values", "get_synonym_value"]
    assert stats[ENVS[0]]["turns"] == {"min": 2, "mean": 2.0, "max": 2}
    assert stats[ENVS[0]]["est_tokens"]["min"] > 0
