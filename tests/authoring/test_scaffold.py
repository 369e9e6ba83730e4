"""`gym env init`: the generated environment checks clean, its tests pass and it runs an eval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polygym.authoring import scaffold
from polygym.authoring.check import PASS, check_env
from polygym.jsonl import iter_jsonl
from tests.conftest import run_gym
from tests.test_surface import private_imports

pytestmark = pytest.mark.e2e

NAME = "my_env"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder where `gym env init my_env` ran (default --dir: the working directory)."""
    root = tmp_path_factory.mktemp("project")
    done = run_gym("env", "init", NAME, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"gym env check {NAME}" in done.stdout
    return root


def test_init_writes_the_documented_layout(project: Path) -> None:
    env_dir = project / "resources_servers" / NAME
    files = sorted(str(p.relative_to(env_dir)) for p in env_dir.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "__init__.py",
        "app.py",
        f"configs/{NAME}.yaml",
        "data/example.jsonl",
        "data/generate.py",
        f"tests/test_{NAME}.py",
    ]
    rows = [json.loads(line) for line in (env_dir / "data" / "example.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    assert all(r["agent_ref"]["name"] == f"{NAME}_simple_agent" for r in rows)
    assert [p.name for p in (project / "resources_servers").iterdir()] == [NAME]  # no staging left
    config = (env_dir / "configs" / f"{NAME}.yaml").read_text()
    assert "model_server: {type: responses_api_models, name: policy_model}" in config
    assert f"jsonl_fpath: resources_servers/{NAME}/data/example.jsonl" in config
    assert private_imports(sorted(env_dir.rglob("*.py")), "resources_servers") == []


def test_the_checker_passes_with_a_correct_rollout(project: Path) -> None:
    report = check_env(project / "resources_servers" / NAME)
    assert report.ok, report.summary()
    assert report.result("verify: correct beats wrong").status == PASS  # example_solution is used
    assert all(r.status == PASS for r in report.results), report.summary()

    done = run_gym("env", "check", NAME, "--json", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_the_generated_tests_pass(project: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", f"resources_servers/{NAME}/tests", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "14 passed" in done.stdout


def test_eval_run_with_the_scripted_model_works_from_the_folder(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    done = run_gym(
        "eval",
        "run",
        "--model-type",
        "scripted_model",
        "--resources-server",
        NAME,
        "--input",
        f"resources_servers/{NAME}/data/example.jsonl",
        "--output",
        str(out),
        cwd=project,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rollouts = list(iter_jsonl(out))
    assert len(rollouts) == 5
    for rollout in rollouts:
        # The scripted model's fallback calls the tool with placeholder arguments, then says "done".
        calls = [i for i in rollout["response"]["output"] if i["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["multiply"]
        assert rollout["reward"] == 0.0 and rollout["multiply_calls"] == 1
    assert list(iter_jsonl(tmp_path / "out_failures.jsonl")) == []


def test_init_refuses_to_overwrite_and_validates_names(project: Path) -> None:
    app = project / "resources_servers" / NAME / "app.py"
    before = app.read_bytes()
    again = run_gym("env", "init", NAME, "--dir", str(project), cwd=project.parent)
    assert again.returncode == 1
    assert "already exists" in again.stderr
    assert app.read_bytes() == before

    bad = run_gym("env", "init", "My-Env", cwd=project)
    assert bad.returncode == 2
    assert "invalid environment name 'My-Env'" in bad.stderr


@pytest.mark.parametrize("name", ["My_env", "2env", "my-env", "_env", "class", "", "a" * 65, "env/x"])
def test_bad_names_are_rejected(name: str) -> None:
    with pytest.raises(scaffold.ScaffoldError, match="invalid environment name"):
        scaffold.check_name(name)


def test_names_and_class_names() -> None:
    for name in ("a", "my_env", "env2", "a__b"):
        scaffold.check_name(name)
    assert scaffold.class_name("my_env") == "MyEnv"
    assert scaffold.class_name("a__b") == "AB"
    assert scaffold.class_name("env2") == "Env2"


def test_dir_option_and_a_failed_generation_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(env_dir: Path) -> None:
        raise scaffold.ScaffoldError("data/generate.py failed")

    monkeypatch.setattr(scaffold, "_generate", broken)
    with pytest.raises(scaffold.ScaffoldError):
        scaffold.create_environment("half_made", tmp_path / "nested")
    assert list((tmp_path / "nested" / "resources_servers").iterdir()) == []
