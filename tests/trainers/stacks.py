"""What the trainer tests share: a CPU policy that returns token ids, test environments written into
the test's folder, a `gym env start` in front of them, and TRL's NeMo Gym rollout path loaded from
``examples/trainers/trl/nemo_gym_grpo.py`` (the file a team runs, so the test checks what ships).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from tests.conftest import BOOM_APP, ROOT

TRL_EXAMPLE = ROOT / "examples" / "trainers" / "trl" / "nemo_gym_grpo.py"


def three_turn_game(doc: str, reward: str) -> str:
    """A server folder's ``app.py``: a game of three turns, each earning ``reward`` (an expression
    of the reply, ``action``)."""
    return f'''
"""{doc}"""
from polygym import EpisodicServer, StepResult


class Game(EpisodicServer):
    async def reset(self, row, session):
        session.state["turns"] = 0
        return "Say anything."

    async def step(self, action, session):
        session.state["turns"] += 1
        reward = {reward}
        over = session.state["turns"] >= 3
        return StepResult(f"turn {{session.state['turns']}} done.", reward, terminated=over)
'''


PARITY_APP = three_turn_game(
    "Each turn whose reply starts with a character of even code point earns 1/3.",
    "1 / 3 if action.strip() and ord(action.strip()[0]) % 2 == 0 else 0.0",
)
TALLY_APP = three_turn_game(
    "Each turn earns a share set by every character of the reply (the sum of their code points,"
    " modulo 97), so two different replies almost never score alike: a GRPO group of a random model"
    " has an advantage to follow in every run, where parity's coin flips tie one group in three.",
    "sum(map(ord, action)) % 97 / 97 / 3",
)

PARITY_CONFIG = """
parity:
  resources_servers:
    parity: {entrypoint: app.py, domain: other, max_episode_steps: 3}
parity_gymnasium_agent:
  responses_api_agents:
    episodic_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: parity}
      model_server: {type: responses_api_models, name: policy_model}
      max_steps: 3
      action_mode: text
"""


BOOM_CONFIG = """
boom:
  resources_servers:
    boom: {domain: other}
boom_simple_agent:
  responses_api_agents:
    simple_agent:
      resources_server: {type: resources_servers, name: boom}
      model_server: {type: responses_api_models, name: policy_model}
"""

ENVIRONMENTS = {
    "parity": (PARITY_APP, PARITY_CONFIG),
    "tally": (TALLY_APP, PARITY_CONFIG.replace("parity", "tally")),
    "boom": (BOOM_APP, BOOM_CONFIG),
}


def write_environments(root: Path, *names: str) -> None:
    """The named test environments as server folders under ``root/resources_servers``."""
    for name in names:
        app, config = ENVIRONMENTS[name]
        folder = root / "resources_servers" / name
        (folder / "configs").mkdir(parents=True)
        (folder / "app.py").write_text(app)
        (folder / "configs" / f"{name}.yaml").write_text(config)


def token_stack_args(policy_url: str, *environments: str, overrides: tuple[str, ...] = ()) -> list[str]:
    """`gym env start` flags: the environments behind ``vllm_model`` in front of ``policy_url``,
    with token capture and exact prefixes on, the head on any free port (``overrides``: more
    ``key=value`` settings)."""
    model = "policy_model.responses_api_models.vllm_model"
    selectors = [arg for env in environments for arg in ("--resources-server", env)]
    return [
        "--model-type", "vllm_model", *selectors, "--head-port", "0",
        f"policy_base_url={policy_url}", "policy_api_key=", "policy_model_name=policy",
        f"{model}.return_token_ids=true", f"{model}.supply_prefix_token_ids=true", *overrides,
    ]  # fmt: skip


def game_row(secret: int) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "system", "content": "Guess the number."}]},
        "agent_ref": {"type": "responses_api_agents", "name": "guess_number_gymnasium_agent"},
        "game": {"low": 1, "high": 8, "secret": secret, "max_guesses": 3},
    }


def agent_row(agent: str, **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Go."}]},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        **fields,
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def trl_example() -> ModuleType:
    """``examples/trainers/trl/nemo_gym_grpo.py`` as a module (it is a script, not a package)."""
    name = "polygym_example_trl_nemo_gym"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TRL_EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
