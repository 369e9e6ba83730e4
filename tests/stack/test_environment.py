"""One environment model: every command reads an environment's config and datasets the same way."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from polygym.blend.mix import resolve
from polygym.blend.spec import BlendSpecError, parse_spec
from polygym.cli import gym
from polygym.servers.resources import ResourcesServer
from polygym.stack.config import ConfigError
from polygym.stack.environment import load_environment
from tests.conftest import ROOT

ENV = "zz_dataset_paths"
TEMPLATE = ROOT / "resources_servers" / "example_single_tool_call"
CONFIG = f"""\
{ENV}_data: resources_servers/{ENV}/data
{ENV}:
  resources_servers:
    {ENV}:
      entrypoint: app.py
{ENV}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: {ENV}}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
      - {{name: example, type: train, jsonl_fpath: "JSONL_FPATH"}}
"""


def run(*args: str) -> Result:
    return CliRunner().invoke(gym, list(args), catch_exceptions=False)


def make_environment(root: Path, jsonl_fpath: str) -> Path:
    """A copy of example_single_tool_call under ``root`` whose one dataset is named by ``jsonl_fpath``."""
    folder = root / "resources_servers" / ENV
    (folder / "configs").mkdir(parents=True)
    (folder / "data").mkdir()
    shutil.copy(TEMPLATE / "app.py", folder / "app.py")
    shutil.copy(TEMPLATE / "data" / "example.jsonl", folder / "data" / "example.jsonl")
    (folder / "configs" / f"{ENV}.yaml").write_text(CONFIG.replace("JSONL_FPATH", jsonl_fpath))
    return folder


@pytest.mark.parametrize(
    "jsonl_fpath",
    ["data/example.jsonl", f"${{{ENV}_data}}/example.jsonl"],
    ids=["relative to the environment folder", "interpolated"],
)
def test_a_dataset_path_resolves_the_same_in_env_check_train_plan_and_data_blend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jsonl_fpath: str
) -> None:
    folder = make_environment(tmp_path, jsonl_fpath)
    monkeypatch.chdir(tmp_path)
    expected = folder / "data" / "example.jsonl"

    check = run("env", "check", ENV, "--json", "--rows", "1")
    dataset = next(r for r in orjson.loads(check.output)["checks"] if r["name"] == "dataset")
    assert dataset["status"] == "pass", dataset
    assert dataset["detail"].startswith(f"{expected.relative_to(tmp_path)}: 5 rows")

    spec = tmp_path / "blend.yaml"
    spec.write_text(f"environments: [{{name: {ENV}}}]\nprompts_per_step: 1\n")
    plan = run("train", "plan", str(spec), "--json")
    assert plan.exit_code == 0, plan.output
    assert [e["rows"] for e in orjson.loads(plan.output)["environments"]] == [5]

    out = tmp_path / "blend.jsonl"
    blend = run("data", "blend", "--env", ENV, "--output", str(out))
    assert blend.exit_code == 0, blend.output
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert rows == [
        {**orjson.loads(line), "agent_ref": {"type": "responses_api_agents", "name": f"{ENV}_simple_agent"}}
        for line in expected.read_bytes().splitlines()
    ]


def test_loaded_environment_knows_its_datasets_and_class() -> None:
    env = load_environment("example_single_tool_call")
    assert issubclass(env.server_class, ResourcesServer)
    assert env.reward_range == (0.0, 1.0)
    assert [d.name for d in env.datasets()] == ["example"]
    path, problem = env.example_dataset()
    assert problem == "" and path == ROOT / "resources_servers/example_single_tool_call/data/example.jsonl"


def test_reading_datasets_does_not_import_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_environment(tmp_path, "data/example.jsonl")
    (folder / "app.py").write_text("raise ImportError('missing dependency: frobnicate')\n")
    monkeypatch.chdir(tmp_path)
    env = load_environment(ENV)
    assert env.find_dataset(env.datasets()[0]) == folder / "data" / "example.jsonl"
    with pytest.raises(ConfigError, match="frobnicate"):
        env.server_class  # noqa: B018


def test_a_broken_config_is_reported_not_taken_for_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec may name an environment without a config when it gives the files, never a broken one."""
    folder = make_environment(tmp_path, "${undefined_data_dir}/example.jsonl")
    monkeypatch.chdir(tmp_path)
    raw = {
        "environments": [{"name": ENV, "train": str(folder / "data" / "example.jsonl")}],
        "prompts_per_step": 1,
    }
    with pytest.raises(BlendSpecError) as info:
        resolve(parse_spec(raw, "inline", tmp_path))
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"inline: environments[0] ({ENV}): ")
    assert "needs '${undefined_data_dir}', which is not set" in info.value.problems[0]


def nemo_gym_variants(root: Path) -> Path:
    """A NeMo Gym folder with no config named after it: two configs, each declaring its own server."""
    folder = root / "resources_servers" / "fmt"
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text("from nemo_gym.base_resources_server import SimpleResourcesServer\n")
    for variant in ("citation", "freeform"):
        (folder / "configs" / f"{variant}.yaml").write_text(
            f"{variant}:\n  resources_servers:\n    fmt:\n      entrypoint: app.py\n"
            f"{variant}_simple_agent:\n  responses_api_agents:\n    simple_agent:\n"
            f"      resources_server: {{type: resources_servers, name: {variant}}}\n"
            "      model_server: {type: responses_api_models, name: policy_model}\n"
        )
    return folder


def test_data_validate_finds_nemo_gym_folders_by_their_configs_server_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polygym.blend.validate import validate_files
    from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR

    folder = nemo_gym_variants(tmp_path / "ng")
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(tmp_path / "ng"))
    rows = tmp_path / "rows.jsonl"
    agent = {"type": "responses_api_agents", "name": "freeform_simple_agent"}
    rows.write_bytes(orjson.dumps({"responses_create_params": {"input": "hi"}, "agent_ref": agent}) + b"\n")
    assert load_environment("freeform").config_path == folder / "configs" / "freeform.yaml"
    assert validate_files([rows], ["freeform"]).problems == []
    assert validate_files([rows]).problems == []  # every environment: the folder's servers by name
    problems = validate_files([rows], ["fmt"]).problems
    assert problems and "its configs declare citation, freeform (name one)" in problems[0]
    assert "Did you mean" not in problems[0]
