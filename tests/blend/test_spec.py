"""Blend specs: loading, the list and map forms, --env flags, clear errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from polygym.blend.mix import load_blend, resolve
from polygym.blend.spec import BlendSpecError, load_spec, parse_spec, spec_from_flags
from tests.blend.helpers import ENVS, example, write


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


def test_eval_only_environments_get_no_quota_and_are_checked(tmp_path: Path) -> None:
    raw = {
        "environments": {"a": {"weight": 3}, "b": {}, "watched": {"eval_only": True}},
        "prompts_per_step": 4,
    }
    spec = parse_spec(raw, "blend.yaml", tmp_path)
    assert [e.name for e in spec.trained] == ["a", "b"]
    plan = spec.plan()
    assert plan.quotas == {"a": 3, "b": 1}
    bad = {
        "environments": {"a": {}, "watched": {"eval_only": True, "weight": 2, "min_per_step": 1}},
        "prompts_per_step": 2,
    }
    with pytest.raises(
        BlendSpecError,
        match=r"environments\.watched: an eval_only environment gets no training quota: "
        r"remove min_per_step, weight",
    ):
        parse_spec(bad, "blend.yaml", tmp_path)
    with pytest.raises(BlendSpecError, match="at least one must be trained"):
        parse_spec(
            {"environments": {"w": {"eval_only": True}}, "prompts_per_step": 1}, "blend.yaml", tmp_path
        )
