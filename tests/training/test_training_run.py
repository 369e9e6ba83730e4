"""`gym train run` end to end with the tiny random policy: every phase runs and every file is written.

Skipped without the training extra. The policy learns nothing here (it is random and trains two
steps); the test checks the run's plumbing and files, the example run (README "Training") checks
what training does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import click
from click.testing import CliRunner

from polygym.cli import gym
from polygym.jsonl import iter_jsonl
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

GAME = {
    "responses_create_params": {"input": [{"role": "system", "content": "Guess."}], "max_output_tokens": 4},
    "game": {"low": 1, "high": 4, "secret": 2, "max_guesses": 2},
}


def test_gym_train_run_writes_every_file(tmp_path: Path) -> None:
    games = tmp_path / "games.jsonl"
    games.write_text(json.dumps(GAME) + "\n")
    spec = tmp_path / "blend.yaml"
    spec.write_text(
        "environments:\n"
        "  mcqa: {}\n"
        "  guess_number:\n"
        "    agent: guess_number_gymnasium_agent\n"
        "    train: games.jsonl\n"
        "    validation: games.jsonl\n"
        "  example_single_tool_call:\n"
        "    eval_only: true\n"
        f"    validation: {ROOT / 'resources_servers/example_single_tool_call/data/example.jsonl'}\n"
        "prompts_per_step: 2\n"
        "responses_per_prompt: 2\n"
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(
        gym,
        [
            "train",
            "run",
            str(spec),
            "--output",
            str(out),
            "--model",
            "tiny",
            "--steps",
            "2",
            "--validation-limit",
            "2",
            "--max-output-tokens",
            "4",
            "--train-layers",
            "1",
            "--learning-rate",
            "1e-3",
            "--validate-every",
            "1",
            "--max-regression",
            "guess_number=1",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "validation before" in result.output and "step 1:" in result.output
    lines = list(iter_jsonl(out / "train_log.jsonl"))
    assert [(line["step"], line["env"]) for line in lines] == [
        (s, env) for s in (0, 1) for env in ("mcqa", "guess_number", "_all")
    ]
    assert all(line["realized_share"] == 0.5 for line in lines if line["env"] != "_all")
    trainer_log = list(iter_jsonl(out / "trainer_log.jsonl"))
    assert any("polygym/mcqa/reward_mean" in line for line in trainer_log)
    # validation values in the log records (what --report-to backends receive): before, every step, after
    validated = [line for line in trainer_log if "polygym/example_single_tool_call/validation_reward" in line]
    assert [line["step"] for line in validated] == [1, 2, 2]  # step 0's and 1's land in the next records
    assert all("polygym/guess_number/reward" in line for line in trainer_log if "loss" in line)
    for phase in ("before", "after"):
        metrics = json.loads((out / f"validation_{phase}_aggregate_metrics.json").read_text())
        assert {m["agent_ref"]["name"] for m in metrics} == {
            "mcqa_simple_agent",
            "guess_number_gymnasium_agent",
            "example_single_tool_call_simple_agent",
        }
        assert len(list(iter_jsonl(out / f"validation_{phase}.jsonl"))) == 5  # 2 mcqa + 1 game + 2 watched
    # validation curves: before (0), after step 1's... every step, and the end (2); the eval_only
    # environment is validated every time but never trained
    curves = list(iter_jsonl(out / "validation.jsonl"))
    assert [(c["step"], c["env"]) for c in curves] == [
        (s, env) for s in (0, 1, 2) for env in ("mcqa", "guess_number", "example_single_tool_call")
    ]
    assert [c["n"] for c in curves[:3]] == [2, 1, 2] and [c["eval_only"] for c in curves[:3]] == [
        False,
        False,
        True,
    ]
    assert (out / "validation" / "step_1.jsonl").is_file()
    assert "example_single_tool_call" not in {line["env"] for line in lines}
    comparison = json.loads((out / "comparison.json").read_text())
    assert {e["env"] for e in comparison["environments"]} >= {
        "mcqa_simple_agent",
        "guess_number_gymnasium_agent",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["validation_regressions"] == []  # a drop of more than 1 is impossible here
    assert summary["trainer_seed"] == summary["blend_seed"] == 0  # default: the spec's seed
    assert set(summary["timings_s"]) >= {"load_model_s", "validation_before_s", "train_s", "total_s"}
    assert summary["generation"]["sequences"] >= 2 * 4
    trained = {
        env: sum(line["generated_tokens"] for line in lines if line["env"] == env)
        for env in ("mcqa", "guess_number")
    }
    for env, tokens in trained.items():
        shares = summary["token_shares"][env]
        assert shares["planned_share"] == 0.5 and shares["trained_tokens"] == tokens
        if sum(trained.values()):
            assert shares["trained_token_share"] == pytest.approx(tokens / sum(trained.values()))
    assert all("trained_token_share" in line and "gradient_share" in line for line in lines)
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_gym_train_run_reports_a_missing_model_package(tmp_path: Path) -> None:
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 1\n")
    result = CliRunner().invoke(
        gym, ["train", "run", str(spec), "-o", str(tmp_path / "o"), "--model", "nope"]
    )
    assert result.exit_code == 2 and "unknown model 'nope'" in result.output


def test_max_regression_flags_are_checked_and_drops_are_found(tmp_path: Path) -> None:
    from polygym.training.validation import regressions

    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 1\n")
    base = ["train", "run", str(spec), "-o", str(tmp_path / "o"), "--model", "tiny"]
    bad = CliRunner().invoke(gym, [*base, "--max-regression", "mcqa"])
    assert bad.exit_code == 2 and "--max-regression 'mcqa': expected ENV=DELTA" in bad.output
    unknown = CliRunner().invoke(gym, [*base, "--max-regression", "mcq=0.1"])
    assert unknown.exit_code == 2 and "--max-regression: no environment mcq in" in unknown.output
    from transformers.integrations import get_available_reporting_integrations

    if "tensorboard" not in get_available_reporting_integrations():
        missing = CliRunner().invoke(gym, [*base, "--report-to", "tensorboard"])
        assert missing.exit_code == 2 and "--report-to tensorboard: not installed" in missing.output

    def validation(path: Path, rewards: dict[str, list[float]]) -> Path:
        rows = [
            {"agent_ref": {"type": "responses_api_agents", "name": f"{env}_agent"}, "_ng_task_index": task,
             "_ng_rollout_index": 0, "responses_create_params": {"input": f"q{task}"}, "reward": value}
            for env, values in rewards.items()
            for task, value in enumerate(values)
        ]  # fmt: skip
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    before = validation(tmp_path / "before.jsonl", {"a": [1.0] * 32, "b": [1.0] * 32, "c": [1.0] * 32})
    # a: 20 of 32 prompts lost; b: 1 of 32 (a point drop past 0.02, an interval reaching 0); c: not scored
    now = validation(tmp_path / "step_4.jsonl", {"a": [0.0] * 20 + [1.0] * 12, "b": [0.0] + [1.0] * 31})
    agents = {env: f"{env}_agent" for env in "abc"}
    found = regressions(4, before, now, {"a": 0.1, "b": 0.02, "c": 0.1}, agents)
    assert [(r.env, r.drop) for r in found] == [("a", pytest.approx(0.625)), ("c", None)]
    assert found[0].interval is not None and 0 < found[0].interval[0] <= 0.625 <= found[0].interval[1]


def test_on_regression_stop_ends_training_after_the_regressed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polygym.collect.regression import Regression
    from polygym.training import run as run_module

    def always(step: int, base: Path, now: Path, limits: Any, agents: Any) -> list[Regression]:
        assert base.name == "validation_before.jsonl" and now.exists()  # judged on the rollouts
        return [Regression("mcqa", step, 0.1, True, 1.0, 0.0, 1.0, (1.0, 1.0), 4)]

    monkeypatch.setattr(run_module, "regressions", always)
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 2\nresponses_per_prompt: 2\n")
    out = tmp_path / "run"
    args = ["train", "run", str(spec), "-o", str(out), "--model", "tiny", "--steps", "4"]
    args += ["--validation-limit", "1", "--max-output-tokens", "2", "--train-layers", "1"]
    args += [
        "--validate-every",
        "1",
        "--max-regression",
        "mcqa=0.1",
        "--on-regression",
        "stop",
        "--seed",
        "7",
    ]
    result = CliRunner().invoke(gym, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "warning: mcqa validation reward fell +1.000 since step 0" in result.output
    assert "stopping after step 1" in result.output
    trained = {line["step"] for line in iter_jsonl(out / "train_log.jsonl")}
    assert trained == {0, 1}  # step 1's update ran, steps 2 and 3 never did
    summary = json.loads((out / "summary.json").read_text())
    assert summary["validation_regressions"][0]["step"] == 1
    assert summary["trainer_seed"] == 7 and summary["blend_seed"] == 0  # separate seeds
    assert [c["step"] for c in iter_jsonl(out / "validation.jsonl")] == [0, 1, 2]  # the end: 2 updates


def test_an_environment_whose_validation_all_fails_stops_the_run_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a machine whose reasoning-gym missed a dependency: every arithmetic /verify failed,
    and training went on for the whole run with that environment's rewards missing."""
    from polygym.servers.base import HTTPError
    from resources_servers.reasoning_gym.app import ReasoningGym

    def broken(*args: Any) -> Any:  # every verify path ends here: each answers 500 as that machine did
        raise HTTPError(500, "basic_arithmetic cannot be built: No module named 'pytz'", "environment_broken")

    monkeypatch.setattr(ReasoningGym, "_result", broken)  # the inline stack serves it in this process
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\n  reasoning_gym: {}\nprompts_per_step: 2\n")
    out = tmp_path / "run"
    args = ["train", "run", str(spec), "-o", str(out), "--model", "tiny", "--steps", "2"]
    args += ["--validation-limit", "2", "--max-output-tokens", "2", "--train-layers", "1"]
    result = CliRunner().invoke(gym, args, catch_exceptions=False)
    assert result.exit_code == 1, result.output
    message = " ".join(result.output.split())
    assert "reasoning_gym: no validation rollout was scored (HTTP 500" in message
    assert "No module named 'pytz'" in message
    assert "mcqa: no validation" not in message
    assert not (out / "train_log.jsonl").exists() or not list(iter_jsonl(out / "train_log.jsonl"))


def test_max_masked_share_alarm_warns_records_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polygym.training.collector import TokenStep

    check = TokenStep.check_masked_share
    # token-in/token-out leaves nothing masked here: a bound below zero makes every step pass it
    monkeypatch.setattr(TokenStep, "check_masked_share", lambda step, bound: check(step, -1.0))
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 2\nresponses_per_prompt: 2\n")
    out = tmp_path / "run"
    args = ["train", "run", str(spec), "-o", str(out), "--model", "tiny", "--steps", "3"]
    args += ["--validation-limit", "1", "--max-output-tokens", "2", "--train-layers", "1"]
    args += ["--max-masked-share", "0", "--on-masked", "stop"]
    result = CliRunner().invoke(gym, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "warning: step 0: 0% of mcqa's rollouts masked (--max-masked-share 0.0)" in result.output
    assert "stopping after step 0: --on-masked stop" in result.output
    lines = list(iter_jsonl(out / "train_log.jsonl"))
    assert {line["step"] for line in lines} == {0}
    mcqa = next(line for line in lines if line["env"] == "mcqa")
    assert mcqa["masked_share"] == 0.0 and mcqa["masked_alarm"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["masked_alarms"] == [{"step": 0, "env": "mcqa"}]
    assert summary["masked_share"] == {"mcqa": 0.0, "_all": 0.0}
    trainer_log = list(iter_jsonl(out / "trainer_log.jsonl"))
    assert any(line.get("polygym/mcqa/masked_alarm") == 1.0 for line in trainer_log)
    bad = CliRunner().invoke(gym, [*args[:6], "--max-masked-share", "1.5"])
    assert bad.exit_code == 2 and "--max-masked-share" in bad.output


def test_gym_train_run_help_documents_every_option() -> None:
    from polygym.cli.train import run

    undocumented = [p.name for p in run.params if isinstance(p, click.Option) and not p.help]
    assert undocumented == []
    help_text = CliRunner().invoke(gym, ["train", "run", "--help"], terminal_width=200).output
    for flag in ("--dynamic-sampling", "--checkpoint-every", "--resume", "--report-to", "--seed"):
        assert flag in help_text


def starving_spec(tmp_path: Path) -> Path:
    """Three trained environments in steps of 2 prompts: the third gets none, in every step."""
    games = tmp_path / "games.jsonl"
    games.write_text(json.dumps(GAME) + "\n")
    spec = tmp_path / "starving.yaml"
    spec.write_text(
        "environments:\n"
        "  mcqa: {}\n"
        "  guess_number:\n"
        "    agent: guess_number_gymnasium_agent\n"
        "    train: games.jsonl\n"
        "    validation: games.jsonl\n"
        "  example_single_tool_call:\n"
        f"    validation: {ROOT / 'resources_servers/example_single_tool_call/data/example.jsonl'}\n"
        "prompts_per_step: 2\n"
        "responses_per_prompt: 2\n"
    )
    return spec


def train_tiny(spec: Path, out: Path, *extra: str) -> Any:
    args = ["train", "run", str(spec), "--output", str(out), "--model", "tiny", "--steps", "1"]
    args += ["--validation-limit", "1", "--max-output-tokens", "4", "--train-layers", "1", *extra]
    return CliRunner().invoke(gym, args, catch_exceptions=False)


def test_a_plan_that_starves_an_environment_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train_tiny(starving_spec(tmp_path), out)
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())  # the console wraps long lines
    assert "warning: plan: example_single_tool_call: starved, 0 prompts in every step" in flat
    assert (
        "example_single_tool_call would get 0 of the 2 prompts in every step of the run (never trained, "
        "still validated); raise prompts_per_step to 12" in flat
    )
    assert "--allow-starved example_single_tool_call to train without it" in flat
    assert "policy tiny" not in flat and not out.exists()  # refused before the model or any file
    typo = train_tiny(starving_spec(tmp_path), out, "--allow-starved", "example_single")
    assert typo.exit_code == 2 and "--allow-starved: no trained environment example_single" in typo.output


def test_every_plan_warning_is_shown_before_step_0_and_an_allowed_starvation_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train_tiny(starving_spec(tmp_path), out, "--allow-starved", "example_single_tool_call")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    warned = [i for i, line in enumerate(lines) if line.startswith("warning: plan: ")]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step 0:"))
    assert len(warned) == 5 and max(warned) < first_step  # too few and drifted (x2), the starved one
    flat = " ".join(result.output.split())
    for env in ("mcqa", "guess_number"):
        assert f"warning: plan: {env}: only 1 prompt x 2 responses = 2 rollouts per step" in flat
    summary = json.loads((out / "summary.json").read_text())
    assert summary["starved_environments"] == ["example_single_tool_call"]
    assert summary["settings"]["allow_starved"] == ["example_single_tool_call"]


def test_an_empty_later_validation_is_a_regression_alarm_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every validation rollout after step 0 lost (the file holds none): an alarm, and the run ends."""
    from polygym.training import run as run_module

    validate = run_module.validate

    def failing_later(collector: Any, blend: Any, output: Path, *args: Any) -> dict[str, list[float]]:
        rewards = validate(collector, blend, output, *args)
        if output.name == "validation_before.jsonl":
            return rewards
        output.write_text("")  # no scored rollout, and no metrics of them
        output.with_name(f"{output.stem}_aggregate_metrics.json").unlink(missing_ok=True)
        return {env: [] for env in rewards}

    monkeypatch.setattr(run_module, "validate", failing_later)
    spec = tmp_path / "blend.yaml"
    spec.write_text("environments:\n  mcqa: {}\nprompts_per_step: 2\nresponses_per_prompt: 2\n")
    out = tmp_path / "run"
    result = train_tiny(spec, out, "--validate-every", "1", "--max-regression", "mcqa=0.1")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "warning: mcqa: no validation rollout was scored at step 1 (--max-regression alarm)" in flat
    assert "warning: no comparison.json" in flat
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["step"], r["env"], r["alarm"], r["drop"]) for r in summary["validation_regressions"]] == [
        (1, "mcqa", True, None)
    ]
    assert summary["regressions"] is None and not (out / "comparison.json").exists()
