"""The catalog's rule for names: which folder a name reaches, and saying so when it is not the shipped one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polygym.errors import ConfigError
from polygym.stack.catalog import (
    NEMO_GYM_ROOT_ENV_VAR,
    SHADOWS,
    find_implementation_dir,
    folder_origin,
    list_implementations,
    project_root,
    tree_root,
)
from tests.conftest import run_gym

SHIPPED = project_root() / "resources_servers" / "example_single_tool_call"


def copy_shipped(into: Path) -> Path:
    """A working directory holding its own ``resources_servers/example_single_tool_call``."""
    folder = into / "resources_servers" / "example_single_tool_call"
    shutil.copytree(SHIPPED, folder, ignore=shutil.ignore_patterns("__pycache__", "data", "tests"))
    return folder


def test_a_shipped_folder_with_no_namesake_is_not_mentioned():
    assert folder_origin("resources_servers", "example_single_tool_call", SHIPPED) is None


def test_a_working_directory_folder_that_shadows_a_shipped_one_is_named(tmp_path, monkeypatch):
    own = copy_shipped(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert find_implementation_dir(
        "resources_servers", "example_single_tool_call"
    ) == tmp_path / own.relative_to(tmp_path)
    origin = folder_origin("resources_servers", "example_single_tool_call", own)
    assert origin is not None and SHADOWS in origin and str(own) in origin and str(SHIPPED) in origin


def test_gym_warns_when_the_working_directory_shadows_a_shipped_environment(tmp_path):
    own = copy_shipped(tmp_path)
    done = run_gym(
        "env", "resolve", "--resources-server", "example_single_tool_call", "--model-type", "scripted_model",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"warning: example_single_tool_call runs the working directory's folder {own}" in done.stderr
    assert SHADOWS in done.stderr


def test_a_nemo_gym_folder_is_named_with_its_root(fake_nemo_gym_env, tmp_path):
    folder = tmp_path / "nemo_gym_root" / "resources_servers" / "ng_env"
    origin = folder_origin("resources_servers", "ng_env", folder)
    assert origin == f"NeMo Gym's folder {folder} (NeMo Gym root {folder.parent.parent})"


def test_a_shipped_folder_standing_for_a_nemo_gym_namesake_says_so(tmp_path, monkeypatch):
    root = tmp_path / "ng"
    (root / "responses_api_agents" / "simple_agent").mkdir(parents=True)
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(root))
    shipped = project_root() / "responses_api_agents" / "simple_agent"
    origin = folder_origin("responses_api_agents", "simple_agent", shipped)
    assert origin is not None and "polygym's shipped responses_api_agents/simple_agent" in origin
    assert "nemo_gym: true" in origin


def test_gymnasium_agent_is_nemo_gyms_name_and_polygyms_agent_has_its_own(tmp_path, monkeypatch):
    """polygym's reset/step agent speaks another protocol than NeMo Gym's gymnasium_agent, so it is
    not shipped under that name: the name reaches NeMo Gym's folder, and only there."""
    assert "gymnasium_agent" not in list_implementations("responses_api_agents")
    assert "episodic_agent" in list_implementations("responses_api_agents")
    root = tmp_path / "ng"
    (root / "responses_api_agents" / "gymnasium_agent").mkdir(parents=True)
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(root))
    found = find_implementation_dir("responses_api_agents", "gymnasium_agent")
    assert found == root / "responses_api_agents" / "gymnasium_agent"


def test_a_nested_nemo_gym_implementation_reaches_its_variant_folder(tmp_path, monkeypatch):
    """NeMo Gym names ``conversational_tool_use/simulation``: the folder
    ``responses_api_agents/conversational_tool_use/simulation/``, in the tree of its root."""
    root = tmp_path / "ng"
    variant = root / "responses_api_agents" / "conversational_tool_use" / "simulation"
    variant.mkdir(parents=True)
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(root))
    assert find_implementation_dir("responses_api_agents", "conversational_tool_use/simulation") == variant
    assert tree_root(variant) == root.resolve()
    assert tree_root(variant.parent) == root.resolve()


@pytest.mark.parametrize("name", ["simple_agent/../../escape", "/etc", "a//b", "a/.hidden", "a/__pycache__"])
def test_a_nested_name_cannot_leave_its_kind_folder(name, tmp_path, monkeypatch):
    (tmp_path / "responses_api_agents" / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="unknown responses_api_agents implementation"):
        find_implementation_dir("responses_api_agents", name)
