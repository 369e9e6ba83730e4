"""A fixed sample of NeMo Gym's catalogue: stored rollouts replayed under polygym (issue 35).

Each folder's ``data/example_rollouts.jsonl`` is replayed by ``gym eval reverify`` against the
folder's stack, which polygym starts from NeMo Gym's own config with NeMo Gym's servers unchanged
(``tests/nemo_gym_replay.py``). The sample covers the issue's failure classes: gymnasium servers,
a same-named folder polygym ships (``mcqa``, ``reasoning_gym``), rows whose inputs are only in
``example_rollouts_materialized_inputs.jsonl`` and rows that carry the verifier's own output
fields, a config whose ``config_paths`` are found under the NeMo Gym root (``toolsandbox``), a
folder whose dependencies are in ``pyproject.toml`` and whose agent is a nested folder
(``conversational_tool_use_simulation``), and judge environments, whose judge
(``judge_model_server``) is the scripted model with one fixed verdict
(``tests/nemo_gym_fixed_judge.yaml``).

``NEMO_GYM`` is data: the rewards NeMo Gym 0.7.0's own reverify gave on the same stack, produced
once by ``python -m benchmarks.nemo_gym_catalogue --folders <the folders below>`` (which runs both
reverifies; 2026-12-06, this machine). polygym must give exactly those rewards, row by row, and
score no row where NeMo Gym's reverify scores none. For the folders that are not judges NeMo Gym's
rewards are also the stored ones (asserted on the data below, so a wrong copy is caught).

The first run on a machine builds NeMo Gym's base environment (minutes); with the cache each
folder takes 15-50 s on a loaded 2-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from tests.nemo_gym_replay import MATERIALIZED, STORED, replay
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, nemo_gym_tree

Key = tuple[int, int]


@dataclass(frozen=True)
class Case:
    config: str
    """The NeMo Gym config the stack starts from, under the folder's ``configs/``."""
    inputs: str
    """Which inputs the replay sends: the run's materialized inputs, or the stored rows less their results."""
    nemo_gym: dict[Key, float] = field(default_factory=dict)
    """The rewards NeMo Gym's own reverify gave; empty where it scores no row, and why in ``note``."""
    judge: bool = False
    note: str = ""


def rewards(*values: float) -> dict[Key, float]:
    return {(task, 0): value for task, value in enumerate(values)}


NEMO_GYM: dict[str, Case] = {
    # rows whose inputs (agent_ref included) are only in the materialized inputs
    "circle_count": Case("circle_count.yaml", MATERIALIZED, rewards(0.0, 1.0, 0.0, 1.0, 1.0)),
    "circle_click": Case("circle_click.yaml", MATERIALIZED, rewards(0.0, 1.0, 0.0, 0.0, 1.0)),
    "proof_genselect": Case("proof_genselect.yaml", MATERIALIZED, rewards(0.0, 1.0, 1.0, 1.0, 0.0)),
    # judges: the fixed verdict \boxed{1}; the stored rewards came from another judge
    "proof_judge": Case("proof_judge.yaml", MATERIALIZED, rewards(1.0, 1.0, 1.0, 1.0, 1.0), judge=True),
    "proof_verification": Case(
        "proof_verification.yaml", MATERIALIZED, rewards(1.0, 0.5, 0.5, 1.0, 0.5), judge=True
    ),
    # gymnasium servers: no /verify and no /reverify_mode, NeMo Gym's reverify stops at its guard
    "blackjack": Case("blackjack.yaml", MATERIALIZED, note="gymnasium: no /verify"),
    "example_multi_turn_gymnasium": Case(
        "example_multi_turn_gymnasium.yaml", MATERIALIZED, note="gymnasium: no /verify"
    ),
    # stored rows without their inputs: both systems are refused by the verifier (HTTP 422)
    "math_advanced_calculations": Case(
        "math_advanced_calculations.yaml", STORED, note="stored tool_choice null: 422 on /verify"
    ),
    # polygym's same-named folders: stored rows lack input fields kept only in example.jsonl
    "mcqa": Case("mcqa.yaml", STORED, note="stored rows carry extracted_answer but lack options"),
    "reasoning_gym": Case("reasoning_gym.yaml", STORED, note="stored rows lack task and entry"),
    # config_paths: responses_api_agents/toolsandbox_agent/configs/toolsandbox_agent.yaml, from the root
    "toolsandbox": Case("toolsandbox.yaml", STORED, rewards(0.0, 0.0, 0.0, 0.0, 0.0)),
    # pyproject.toml dependencies and a nested agent folder (conversational_tool_use/simulation)
    "conversational_tool_use_simulation": Case(
        "conversational_tool_use_simulation.yaml",
        STORED,
        judge=True,
        note="stateful /verify: the session its rollout built is gone, HTTP 400 in both",
    ),
}
STORED_REWARDS = {"circle_count", "circle_click", "proof_genselect", "toolsandbox"}
"""Folders where NeMo Gym's reverify gives back the stored rewards (the others: another judge)."""


def test_the_recorded_rewards_are_the_stored_ones_where_no_judge_changed() -> None:
    root = nemo_gym_tree()
    for folder in STORED_REWARDS:
        path = root / "resources_servers" / folder / "data" / "example_rollouts.jsonl"
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        stored = {(row["_ng_task_index"], row["_ng_rollout_index"]): row["reward"] for row in rows}
        assert NEMO_GYM[folder].nemo_gym == stored, folder


@pytest.mark.e2e
@pytest.mark.nemo_gym
@pytest.mark.parametrize("folder", sorted(NEMO_GYM))
def test_stored_rollouts_replay_with_nemo_gyms_rewards(folder: str, tmp_path: Path) -> None:
    if not NEMO_GYM_PYTHON.is_file():
        pytest.fail(f"this test needs Python 3.13.0 at {NEMO_GYM_PYTHON} (pyenv install 3.13.0)")
    case = NEMO_GYM[folder]
    root = nemo_gym_tree()
    config = root / "resources_servers" / folder / "configs" / case.config
    result = replay(root, folder, config, tmp_path / folder, judge=case.judge, with_nemo_gym=False)
    assert result.error == ""
    assert result.inputs == case.inputs
    logs = (tmp_path / folder / "polygym.log").read_text()[-3000:]
    assert result.polygym == case.nemo_gym, f"{case.note}\n{logs}"
    assert set(result.polygym) <= set(result.stored)
