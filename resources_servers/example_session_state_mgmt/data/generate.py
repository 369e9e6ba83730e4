"""Write the counter datasets: example (5 rows), train (200) and validation (50), all disjoint.

Run from anywhere: ``python resources_servers/example_session_state_mgmt/data/generate.py`` writes
all three splits next to this file; ``--output PATH`` writes one split (``--split``, default
``example``) to PATH; ``--output-dir DIR`` writes all three into DIR. Seeded, so re-running
reproduces every file byte for byte; tool schemas come from the server class so they never drift
from the code.

Every prompt holds ``amounts: a, b, c.`` (integers joined by ``, `` and ended by ``.``): scripted
test policies read the amounts with that pattern, so keep it when adding templates. The start
value is deliberately not in the prompt: the policy has to read the counter.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main
from resources_servers.example_session_state_mgmt.app import ExampleSessionStateMgmt

SEED = 90417
SPLITS = {"example": 5, "train": 200, "validation": 50}
DATA_DIR = Path(__file__).resolve().parent
AGENT = "example_session_state_mgmt_simple_agent"

SYSTEM = (
    "You operate a counter through tools. The counter already holds a start value that you are "
    "not told. Change it only with the increment tool and read it only with the get_value tool."
)
TEMPLATES = [
    "Add the following amounts to the counter, one increment call per amount and in this order, "
    "amounts: {amounts}. Then read the counter with get_value and reply with 'Final value: <number>'.",
    "Please apply these changes to the counter in the order given (negative numbers subtract), "
    "amounts: {amounts}. Afterwards check the counter with get_value and finish with "
    "'Final value: <number>'.",
    "Run one increment per number, keeping the order, amounts: {amounts}. When you are done, call "
    "get_value and tell me the result as 'Final value: <number>'.",
]


def _amount(rng: random.Random) -> int:
    value = 0
    while value == 0:
        value = rng.randint(-20, 30)
    return value


def build_splits(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split from one seeded stream; no two rows share their list of amounts."""
    rng = random.Random(seed)
    # Only polygym's two tools: NeMo Gym's increment_counter/get_counter_value are for its rows.
    tools = [t for t in ExampleSessionStateMgmt.tool_schemas() if t["name"] in ("increment", "get_value")]
    seen: set[tuple[int, ...]] = set()
    splits: dict[str, list[dict]] = {}
    for split, size in SPLITS.items():
        rows: list[dict] = []
        while len(rows) < size:
            increments = [_amount(rng) for _ in range(rng.randint(2, 5))]
            initial = rng.randint(-50, 100)
            if sum(increments) == 0 or tuple(increments) in seen:  # doing nothing must not pass
                continue
            seen.add(tuple(increments))
            prompt = rng.choice(TEMPLATES).format(amounts=", ".join(map(str, increments)))
            rows.append(
                {
                    "responses_create_params": {
                        "input": [
                            {"role": "developer", "content": SYSTEM},
                            {"role": "user", "content": prompt},
                        ],
                        "tools": tools,
                    },
                    "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                    "initial_value": initial,
                    "increments": increments,
                    "expected_final_value": initial + sum(increments),
                }
            )
        splits[split] = rows
    return splits


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: build_splits(), SPLITS, DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
