"""Resolving a spec against its environments: agents, data files, and every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from polygym.blend.mix import resolve
from polygym.blend.spec import BlendSpecError, load_spec
from tests.blend.helpers import ENVS, example, write


def problems_of(path: Path) -> list[str]:
    with pytest.raises(BlendSpecError) as info:
        resolve(load_spec(path))
    return info.value.problems


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


def test_an_eval_only_environment_is_served_and_validated_but_never_trained(tmp_path: Path) -> None:
    from polygym.blend.mix import load_blend
    from polygym.collect.dataset import DatasetError

    spec = write(
        tmp_path / "s.yaml",
        f"""
environments:
  {ENVS[0]}: {{train: {example(ENVS[0])}}}
  {ENVS[1]}: {{eval_only: true, validation: {example(ENVS[1])}}}
prompts_per_step: 2
""",
    )
    blend = load_blend(load_spec(spec))
    assert blend.rows[ENVS[1]] == [] and blend.plan().quotas == {ENVS[0]: 2}
    assert {row["agent_ref"]["name"] for row in blend.ordered("concat")} == {f"{ENVS[0]}_simple_agent"}
    assert {i.env for s in blend.sampler().steps(0, 3) for i in s.items} == {ENVS[0]}
    assert load_blend(load_spec(spec), split="validation").rows[ENVS[1]]
    unwatched = write(tmp_path / "u.yaml", spec.read_text().replace(f", validation: {example(ENVS[1])}", ""))
    with pytest.raises(DatasetError, match=f"environments \\({ENVS[1]}\\): eval_only but no validation rows"):
        load_blend(load_spec(unwatched))


def test_an_eval_only_environment_needs_no_training_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interference example's held-out C: a config that lists no datasets, validation rows given."""
    from polygym.blend.mix import load_blend
    from tests.conftest import ROOT

    folder = ROOT / "examples" / "interference"
    monkeypatch.chdir(folder)  # C's config lives in the example's own resources_servers/
    members = {m.name: m for m in resolve(load_spec(folder / "blend.yaml"))}
    held = members["keyword_constraints_heldout"]
    assert held.train == [] and [p.name for p in held.validation] == ["heldout.jsonl"]
    rows = load_blend(load_spec(folder / "blend.yaml"), split="validation").rows
    assert {row.data["position"] for row in rows["keyword_constraints_heldout"]} == {"first"}
