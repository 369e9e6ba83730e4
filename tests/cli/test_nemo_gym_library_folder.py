"""A NeMo Gym folder with no server to run (a library such as ``sec_local_index``) is an exit-2
error naming it and why, from every command that starts a stack, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym.cli import gym

LIBRARY_CONFIG = """library:
  resources_servers:
    library:
      entrypoint: search.py
      description: Shared search code. Not a standalone server.
"""


@pytest.fixture
def library_config(tmp_path: Path) -> Path:
    """NeMo Gym's tree (the nemo_gym package at its root) with a library folder and its config."""
    root = tmp_path / "nemo-gym"
    (root / "nemo_gym").mkdir(parents=True)
    (root / "nemo_gym" / "__init__.py").write_text("")
    folder = root / "resources_servers" / "library"
    (folder / "configs").mkdir(parents=True)
    (folder / "search.py").write_text("from resources_servers.library.index import Index\n")
    config = folder / "configs" / "library.yaml"
    config.write_text(LIBRARY_CONFIG)
    return config


@pytest.mark.parametrize(
    "command",
    [("env", "start", "--head-port", "0"), ("eval", "reverify", "--rollouts", "out.jsonl")],
)
def test_a_library_folder_is_refused_naming_it(
    library_config: Path, command: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.jsonl").write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "response": {}}\n')
    done = CliRunner().invoke(gym, [*command, "--config", str(library_config)])
    assert done.exit_code == 2, done.output
    folder = library_config.parent.parent
    said = f"library: NeMo Gym's folder {folder} has no server to run: its entrypoint search.py"
    assert said in done.output
    assert "(its config says: Shared search code. Not a standalone server.)" in done.output
    assert f"note: library runs NeMo Gym's folder {folder}" in done.output
    assert isinstance(done.exception, SystemExit)  # an error said, not a traceback
