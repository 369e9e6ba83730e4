"""NeMo Gym's gymnasium environments run with NeMo Gym's own ``gymnasium_agent`` (issue 35, names).

polygym's reset/step agent once shipped as ``gymnasium_agent`` and took NeMo Gym's name: every
rollout of NeMo Gym's gymnasium environments failed with HTTP 404 (it calls ``/seed_session``).
It is ``episodic_agent`` now, so NeMo Gym's configs reach NeMo Gym's agent. Two of the five
gymnasium environments of NeMo Gym 0.7.0 (the two that need nothing beyond nemo-gym, so the
cached base environment serves them) run their example rows under ``gym eval run`` with the
scripted model, from a working directory outside the wheel (``--nemo-gym-root`` only).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl
from polygym.stack.env_build import CACHE_ENV_VAR
from tests.conftest import gym_command
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, env_cache, nemo_gym_tree

BUILD_TIMEOUT_S = 1800
"""The first run on a machine builds NeMo Gym's base environment (minutes); later runs reuse it."""
AGENTS = {
    "blackjack": "blackjack_gymnasium_agent",
    "example_multi_turn_gymnasium": "example_multi_turn_gymnasium_agent",
}
"""Each environment's agent instance in its NeMo Gym config (both run NeMo Gym's gymnasium_agent)."""


@pytest.mark.e2e
@pytest.mark.nemo_gym
@pytest.mark.parametrize("environment", sorted(AGENTS))
def test_a_nemo_gym_gymnasium_environment_runs_with_nemo_gyms_agent(environment: str, tmp_path: Path) -> None:
    if not NEMO_GYM_PYTHON.is_file():
        pytest.fail(f"this test needs Python 3.13.0 at {NEMO_GYM_PYTHON} (pyenv install 3.13.0)")
    root = nemo_gym_tree()
    folder = root / "resources_servers" / environment
    args = [
        *("eval", "run", "--nemo-gym-root", str(root), "--nemo-gym-python", str(NEMO_GYM_PYTHON)),
        *("--config", str(folder / "configs" / f"{environment}.yaml"), "--model-type", "scripted_model"),
        *("--input", str(folder / "data" / "example.jsonl"), "--output", "out.jsonl"),
    ]
    done = subprocess.run(
        gym_command(*args),
        cwd=tmp_path,
        env={**os.environ, CACHE_ENV_VAR: str(env_cache())},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    agent_folder = root / "responses_api_agents" / "gymnasium_agent"
    assert f"{AGENTS[environment]} runs NeMo Gym's folder {agent_folder}" in done.stderr
    files = RunFiles(tmp_path / "out.jsonl")
    assert list(iter_jsonl(files.failures)) == []
    rollouts = list(iter_jsonl(files.output))
    assert len(rollouts) == 5
    for rollout in rollouts:
        assert rollout["reward"] in (-1.0, 0.0, 1.0)
        assert rollout["agent_ref"]["name"] == AGENTS[environment]
        # the episode's end as NeMo Gym's agent reports it (polygym's episodic_agent has no such fields)
        assert rollout["terminated"] or rollout["truncated"]
