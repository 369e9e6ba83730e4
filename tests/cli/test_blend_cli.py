"""`gym data blend`, `gym data validate` and `gym train plan` as a user runs them."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from polygym.blend.mix import load_blend
from polygym.blend.spec import load_spec
from polygym.cli import gym
from tests.conftest import ROOT
from tests.conftest import TWO_ENV_SPEC as SPEC

ENVS = ("example_single_tool_call", "example_multi_step")
AGENTS = tuple(f"{e}_simple_agent" for e in ENVS)


def run(*args: str) -> Result:
    return CliRunner().invoke(gym, list(args), catch_exceptions=False)


def example(env: str) -> Path:
    return ROOT / "resources_servers" / env / "data" / "example.jsonl"


def rows_of(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def jq_recipe(path: Path) -> bytes:
    """What the documented recipe writes: one jq command per environment, appended."""
    out = b""
    for env in ENVS:
        program = f'. + {{"agent_ref": {{"type": "responses_api_agents", "name": "{env}_simple_agent"}}}}'
        if shutil.which("jq"):
            out += subprocess.run(
                ["jq", "-c", program, str(example(env))], capture_output=True, check=True
            ).stdout
        else:  # the same transformation: agent_ref replaced in place or appended, compact JSON
            for row in rows_of(example(env)):
                row["agent_ref"] = {"type": "responses_api_agents", "name": f"{env}_simple_agent"}
                out += orjson.dumps(row) + b"\n"
    path.write_bytes(out)
    return out


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "blend.yaml"
    path.write_text(SPEC)
    return path


def test_env_flags_in_concat_order_equal_the_jq_recipe(tmp_path: Path) -> None:
    out = tmp_path / "blend.jsonl"
    result = run("data", "blend", "--env", ENVS[0], "--env", ENVS[1], "--output", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == jq_recipe(tmp_path / "jq.jsonl")
    assert [r["agent_ref"]["name"] for r in rows_of(out)] == [AGENTS[0]] * 5 + [AGENTS[1]] * 5
    assert "10 rows written" in result.output


def test_spec_in_concat_order_equals_the_jq_recipe_and_rows_without_agent_ref_get_one(
    tmp_path: Path, spec: Path
) -> None:
    bare = tmp_path / "bare.jsonl"
    rows = rows_of(example(ENVS[1]))
    for row in rows:
        del row["agent_ref"]
    bare.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "spec.jsonl"
    assert run("data", "blend", "--spec", str(spec), "--output", str(out)).exit_code == 0
    assert out.read_bytes() == jq_recipe(tmp_path / "jq.jsonl")
    spec.write_text(SPEC.replace("    weight: 1\n", "    weight: 1\n    train: bare.jsonl\n"))
    again = tmp_path / "again.jsonl"
    assert run("data", "blend", "--spec", str(spec), "--output", str(again)).exit_code == 0
    assert rows_of(again)[5:] == [
        {**r, "agent_ref": {"type": "responses_api_agents", "name": AGENTS[1]}} for r in rows
    ]


def test_steps_order_follows_the_sampler(tmp_path: Path, spec: Path) -> None:
    out = tmp_path / "steps.jsonl"
    result = run(
        "data", "blend", "--spec", str(spec), "--order", "steps", "--steps", "6", "--output", str(out)
    )
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    assert len(rows) == 24
    sampler = load_blend(load_spec(spec)).sampler()
    assert rows == [item.row for step in sampler.steps(0, 6) for item in step.items]
    for step in range(6):
        names = Counter(r["agent_ref"]["name"] for r in rows[step * 4 : step * 4 + 4])
        assert names == {AGENTS[0]: 3, AGENTS[1]: 1}
    default = tmp_path / "cover.jsonl"
    assert (
        run("data", "blend", "--spec", str(spec), "--order", "steps", "--output", str(default)).exit_code == 0
    )
    assert len(rows_of(default)) == 5 * 4  # 5 steps until the 1-per-step environment used all 5 rows


def test_shuffled_order_is_a_seeded_permutation(tmp_path: Path, spec: Path) -> None:
    outputs = []
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        out = tmp_path / f"{name}.jsonl"
        assert (
            run(
                "data",
                "blend",
                "--spec",
                str(spec),
                "--order",
                "shuffled",
                "--seed",
                seed,
                "--output",
                str(out),
            ).exit_code
            == 0
        )
        outputs.append(out.read_bytes())
    concat = jq_recipe(tmp_path / "jq.jsonl")
    assert sorted(outputs[0].splitlines()) == sorted(concat.splitlines())
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]


def test_blend_usage_errors(tmp_path: Path, spec: Path) -> None:
    out = str(tmp_path / "x.jsonl")
    both = run("data", "blend", "--spec", str(spec), "--env", ENVS[0], "--output", out)
    assert both.exit_code == 2 and "not both" in both.stderr
    neither = run("data", "blend", "--output", out)
    assert neither.exit_code == 2 and "nothing to blend" in neither.stderr
    typo = run("data", "blend", "--env", "example_multi_stp", "--output", out)
    assert typo.exit_code == 2 and "Did you mean 'example_multi_step'?" in typo.stderr
    steps = run("data", "blend", "--env", ENVS[0], "--order", "steps", "--output", out)
    assert steps.exit_code == 2 and "--prompts-per-step" in steps.stderr
    assert not Path(out).exists()


def test_blend_refuses_bad_rows_with_file_and_line(tmp_path: Path, spec: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(example(ENVS[1]).read_bytes() + b'{"responses_create_params": {"tools": []}}\nnot json\n')
    spec.write_text(SPEC.replace("    weight: 1\n", "    weight: 1\n    train: bad.jsonl\n"))
    result = run("data", "blend", "--spec", str(spec), "--output", str(tmp_path / "o.jsonl"))
    assert result.exit_code == 2
    assert f"{bad}:6: responses_create_params.input: missing" in result.stderr
    assert (
        f"{bad}:6: expected_synonyms: missing (required by the example_multi_step verifier)" in result.stderr
    )
    assert f"{bad}:7: (row): invalid JSON" in result.stderr


def test_validate_good_files_prints_counts(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.jsonl"
    jq_recipe(mixed)
    result = run("data", "validate", str(mixed))
    assert result.exit_code == 0, result.output
    for env in ENVS:
        assert env in result.output
    assert "10 rows checked: no problems" in result.output
    assert "characters / 4" in result.output
    as_json = orjson.loads(run("data", "validate", str(mixed), "--json").stdout)
    counts = {e["env"]: e["rows"] for e in as_json["environments"]}
    assert counts == {ENVS[0]: 5, ENVS[1]: 5} and as_json["problems"] == []
    weather = next(e for e in as_json["environments"] if e["env"] == ENVS[0])
    assert weather["tools"] == ["get_weather"] and weather["turns"]["max"] == 2


def test_validate_reports_every_bad_row(tmp_path: Path) -> None:
    rows = rows_of(example(ENVS[0]))[:3] + rows_of(example(ENVS[1]))[:3]
    rows[0]["expected_city"] = 42
    rows[1]["agent_ref"]["name"] = "example_single_tool_cal_simple_agent"
    rows[3]["expected_synonyms"] = "not a list"
    rows[4]["responses_create_params"]["input"] = {"role": "user"}  # [] is valid, as in NeMo Gym
    rows[5]["responses_create_params"]["temperature"] = "hot"
    lines = [orjson.dumps(r) for r in rows] + [b"[1, 2]"]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    result = run("data", "validate", str(data))
    assert result.exit_code == 1
    err = result.stderr
    assert (
        f"{data}:1: expected_city: Input should be a valid string (example_single_tool_call verifier)" in err
    )
    assert f"{data}:2: agent_ref.name: unknown agent 'example_single_tool_cal_simple_agent'." in err
    assert "Did you mean 'example_single_tool_call_simple_agent'?" in err
    assert f"{data}:4: expected_synonyms: Input should be a valid list (example_multi_step verifier)" in err
    assert f"{data}:5: responses_create_params.input: must be a string or a list of items, got dict" in err
    assert f"{data}:6: responses_create_params.temperature: must be a number from 0 to 2, got 'hot'" in err
    assert f"{data}:7: (row): must be a JSON object, got list" in err
    assert "3" not in [line.split(":")[1] for line in err.splitlines() if line.startswith(str(data))]
    assert "6 problems" in result.stdout


def test_validate_with_one_env_routes_rows_without_agent_ref(tmp_path: Path) -> None:
    rows = rows_of(example(ENVS[1]))
    for row in rows:
        del row["agent_ref"]
    data = tmp_path / "bare.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert run("data", "validate", str(data), "--env", ENVS[1]).exit_code == 0
    unrouted = run("data", "validate", str(data))
    assert unrouted.exit_code == 1
    assert f"{data}:1: agent_ref: missing; add it, or pass --env NAME" in unrouted.stderr
    weather = tmp_path / "weather.jsonl"
    bare_weather = [{k: v for k, v in r.items() if k != "agent_ref"} for r in rows_of(example(ENVS[0]))]
    weather.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in bare_weather))
    wrong_env = run("data", "validate", str(weather), "--env", ENVS[1])
    assert wrong_env.exit_code == 1
    assert (
        f"{weather}:1: expected_synonyms: missing (required by the example_multi_step verifier)"
        in wrong_env.stderr
    )
    typo = run("data", "validate", str(data), "--env", "example_multi")
    assert typo.exit_code == 1 and "--env example_multi: unknown environment" in typo.stderr
    routed = tmp_path / "routed.jsonl"
    jq_recipe(routed)
    typo_routed = run("data", "validate", str(routed), "--env", "example_multi")
    assert typo_routed.exit_code == 1 and "Did you mean 'example_multi_step'?" in typo_routed.stderr
    missing = run("data", "validate", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 1 and "no such file" in missing.stderr


def test_train_plan_table_and_json(spec: Path) -> None:
    table = run("train", "plan", str(spec))
    assert table.exit_code == 0, table.output
    assert "global batch: 4 prompts x 2 responses = 8 rollouts per step" in table.output
    flat = " ".join(table.output.split())  # the console wraps long lines
    assert "warning: example_multi_step: only 1 prompt x 2 responses = 2 rollouts per step" in flat
    plan = orjson.loads(run("train", "plan", str(spec), "--json").stdout)
    assert plan["global_batch_size"] == 8
    envs = {e["name"]: e for e in plan["environments"]}
    assert envs[ENVS[0]]["quota"] == 3 and envs[ENVS[1]]["quota"] == 1
    assert (
        envs[ENVS[0]]["steps_per_epoch"] == pytest.approx(5 / 3) and envs[ENVS[1]]["steps_per_epoch"] == 5.0
    )
    assert plan["suggested_prompts_per_step"] == 15  # 4 prompts x 2 responses = 8 rollouts of the smaller
    quiet = orjson.loads(
        run("train", "plan", str(spec), "--json", "--warn-below", "1", "--warn-below-rollouts", "2").stdout
    )
    assert quiet["warnings"] == [] and quiet["starved"] == []


def test_train_plan_infeasible_spec_suggests_a_step_size(tmp_path: Path, spec: Path) -> None:
    spec.write_text(
        SPEC.replace("    weight: 3\n", "    weight: 3\n    min_per_step: 3\n").replace(
            "    weight: 1\n", "    weight: 1\n    min_per_step: 2\n"
        )
    )
    result = run("train", "plan", str(spec))
    assert result.exit_code == 2
    assert "the minimums add up to 5 prompts" in result.stderr
    assert "raise prompts_per_step to at least 5" in result.stderr
    ok = orjson.loads(run("train", "plan", str(spec), "--json", "--prompts-per-step", "5").stdout)
    assert {e["name"]: e["quota"] for e in ok["environments"]} == {ENVS[0]: 3, ENVS[1]: 2}
    bad = tmp_path / "bad.yaml"
    bad.write_text("environments: []\nprompts_per_step: 0\n")
    broken = run("train", "plan", str(bad))
    assert broken.exit_code == 2
    assert f"{bad}: environments: List should have at least 1 item" in broken.stderr
    assert f"{bad}: prompts_per_step: Input should be greater than or equal to 1" in broken.stderr
