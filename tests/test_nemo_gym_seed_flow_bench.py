"""benchmarks/nemo_gym_seed_flow: the stack and rows it builds match NeMo Gym 0.7.0's own configs.

The benchmark gives ng_run a venv for each server folder it expects; a folder it misses would make
ng_run build a venv (a download, minutes) inside the measurement. These read the wheel's configs
only: nothing of NeMo Gym runs.
"""

from pathlib import Path

import pytest
import yaml

from benchmarks.nemo_gym_seed_flow import SERVER_FOLDERS, config_files, nemo_gym_rows
from polygym.jsonl import iter_jsonl
from tests.nemo_gym_wheel import nemo_gym_tree

pytestmark = pytest.mark.nemo_gym


def servers(root: Path) -> dict[str, str]:
    """Each server instance the configs define -> its folder (``kind/implementation``)."""
    found = {}
    for path in config_files(root):
        for instance, body in yaml.safe_load(path.read_text()).items():
            [(kind, implementations)] = body.items()
            [(implementation, _)] = implementations.items()
            found[instance] = f"{kind}/{implementation}"
    return found


def test_every_server_ng_run_starts_has_a_prepared_venv() -> None:
    assert set(servers(nemo_gym_tree()).values()) == set(SERVER_FOLDERS)


def test_each_row_names_an_agent_its_folders_config_defines(tmp_path: Path) -> None:
    root = nemo_gym_tree()
    rows = list(iter_jsonl(nemo_gym_rows(root, tmp_path / "rows.jsonl")))
    defined = servers(root)
    assert len(rows) == 10
    for row in rows:
        assert defined[row["agent_ref"]["name"]] == "responses_api_agents/simple_agent"
    assert [r["responses_create_params"] for r in rows[:5]] == [
        r["responses_create_params"]
        for r in iter_jsonl(root / "resources_servers/example_single_tool_call/data/example.jsonl")
    ]
