"""`gym train compare-mixes` end to end with the tiny random policy, one step per arm.

Skipped without the training extra. The random policy learns nothing; the test checks that every
arm starts from the same weights, trains only its environments, is validated on all of them
(the spec's eval_only one too), and that the cross-arm files say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import yaml
from click.testing import CliRunner

from polygym.cli import gym
from polygym.jsonl import iter_jsonl
from polygym.training.compare_mixes import parse_arm
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

ENVS = ("mcqa", "keyword_constraints", "example_single_tool_call")


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "blend.yaml"
    spec.write_text(
        "environments:\n"
        "  mcqa: {}\n"
        "  keyword_constraints: {}\n"
        "  example_single_tool_call:\n"
        "    eval_only: true\n"
        f"    validation: {ROOT / 'resources_servers/example_single_tool_call/data/example.jsonl'}\n"
        "prompts_per_step: 2\n"
        "responses_per_prompt: 2\n"
    )
    return spec


def test_compare_mixes_trains_each_arm_from_the_same_weights_and_validates_every_env(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    out = tmp_path / "compare"
    result = CliRunner().invoke(
        gym,
        ["train", "compare-mixes", str(spec), "--arm", "M=mcqa", "--arm", "M+K=mcqa,keyword_constraints",
         "--output", str(out), "--model", "tiny", "--steps", "1", "--validation-limit", "2",
         "--max-output-tokens", "4", "--train-layers", "1", "--learning-rate", "1e-2", "--seed", "3"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "[M] validation before" in result.output and "[M+K] step 0:" in result.output
    # each arm trains only its environments; the others are eval_only in its spec
    arm_spec = yaml.safe_load((out / "M" / "blend.yaml").read_text())
    assert [env for env, e in arm_spec["environments"].items() if e.get("eval_only")] == [
        "keyword_constraints",
        "example_single_tool_call",
    ]
    for arm, trained in (("M", {"mcqa"}), ("M+K", {"mcqa", "keyword_constraints"})):
        logged = {line["env"] for line in iter_jsonl(out / arm / "train_log.jsonl")} - {"_all"}
        assert logged == trained
        assert json.loads((out / arm / "summary.json").read_text())["trainer_seed"] == 3
    table = json.loads((out / "table.json").read_text())
    assert [arm["arm"] for arm in table] == ["M", "M+K"]
    for arm in table:
        assert [row["env"] for row in arm["environments"]] == list(ENVS)
        assert arm["worst_delta"] == min(row["delta"] for row in arm["environments"])
        for row in arm["environments"]:
            assert row["n"] == 2 and 0 <= row["mcnemar_p"] <= 1
            assert row["output_tokens_before"] is not None and row["output_tokens_before"] <= 4
    # the same initial weights: step 0 is the same greedy validation in both arms
    first = [(r["env"], r["reward_before"], r["output_tokens_before"]) for r in table[0]["environments"]]
    assert first == [
        (r["env"], r["reward_before"], r["output_tokens_before"]) for r in table[1]["environments"]
    ]
    assert json.loads((out / "start.json").read_text()) == {"step0_replies_identical_across_arms": True}
    curves = list(iter_jsonl(out / "curves.jsonl"))
    assert {(c["arm"], c["step"], c["env"]) for c in curves} == {
        (arm, step, env) for arm in ("M", "M+K") for step in (0, 1) for env in ENVS
    }
    assert (out / "curves.png").stat().st_size > 0
    assert "| M+K | keyword_constraints | yes |" in (out / "table.md").read_text()
    assert "## mcqa" in (out / "samples.md").read_text()


def test_the_policy_is_loaded_once_and_every_arm_starts_from_its_initial_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random policy learns nothing in one step, so the run above cannot tell a restored start from
    an unrestored one: here every arm's training moves the weights for certain, and each arm's start
    is fingerprinted as its training begins."""
    import torch

    from polygym.training import compare_mixes, models

    loads: list[str] = []
    real_load = models.load_policy

    def counting_load(name: str, dtype: object = None) -> tuple[object, object]:
        loads.append(name)
        return real_load(name, dtype)

    starts: list[dict[str, torch.Tensor]] = []
    real_train_run = compare_mixes.train_run

    def fingerprinting_train_run(
        settings: object, echo: object, policy: tuple[torch.nn.Module, object]
    ) -> object:
        model = policy[0]
        starts.append({name: t.detach().clone() for name, t in model.state_dict().items()})
        result = real_train_run(settings, echo=echo, policy=policy)  # type: ignore[arg-type]
        with torch.no_grad():  # what any real training step does: the weights move
            for parameter in model.parameters():
                parameter.add_(1.0)
        return result

    monkeypatch.setattr(models, "load_policy", counting_load)
    monkeypatch.setattr(compare_mixes, "train_run", fingerprinting_train_run)
    result = CliRunner().invoke(
        gym,
        ["train", "compare-mixes", str(_spec(tmp_path)), "--arm", "M=mcqa", "--arm", "K=keyword_constraints",
         "--arm", "M+K=mcqa,keyword_constraints", "--output", str(tmp_path / "o"), "--model", "tiny",
         "--steps", "1", "--validation-limit", "1", "--max-output-tokens", "2", "--train-layers", "1"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert loads == ["tiny"]
    assert len(starts) == 3
    for later in starts[1:]:
        assert later.keys() == starts[0].keys()
        assert all(torch.equal(later[name], starts[0][name]) for name in later)


@pytest.mark.parametrize(
    ("text", "needle"),
    [("A", "NAME=ENV"), ("A=", "NAME=ENV"), ("a/b=mcqa", "folder name")],
)
def test_malformed_arms_are_refused(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_arm(text)


def test_an_arm_naming_an_unknown_environment_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 1\n")
    result = CliRunner().invoke(
        gym,
        ["train", "compare-mixes", str(spec), "--arm", "a=mcqa", "--arm", "b=mcq", "-o", str(tmp_path / "o"),
         "--model", "tiny"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--arm b: no environment mcq" in result.output
