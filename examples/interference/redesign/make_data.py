"""Write the redesigned interference experiment's rows: 100+ validation prompts per environment.

- **A** (``reasoning_gym``, one-digit arithmetic): every distinct question of the train_grpo
  example's generator (242), a seeded random 100 held out for validation, the other 142 trained.
- **B** (``keyword_constraints``, "contains the word"): the held-out keywords of the shipped
  generator, each with six word limits (12 to 30): 120 validation rows. Training uses the shipped
  ``train.jsonl`` (other keywords).
- **C** (``keyword_constraints_heldout``, "starts with the word"): the same 120 keyword/limit pairs
  in the wording no arm trains.

Run ``python examples/interference/redesign/make_data.py``: deterministic, writes ``data/*.jsonl``
next to this file (the same bytes on every run).
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from resources_servers.keyword_constraints.data.generate import HELD_WORDS, row

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent / "data"
A_VALIDATION = 100
WORD_LIMITS = (12, 15, 18, 20, 25, 30)


def train_grpo_data() -> ModuleType:
    """The train_grpo example's data script (a file, not a package): its arithmetic rows."""
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "examples/train_grpo/make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keyword_rows(position: str) -> list[dict]:
    """Every held-out keyword with every word limit, in a seeded order."""
    combos = [(word, limit) for word in HELD_WORDS for limit in WORD_LIMITS]
    random.Random(7).shuffle(combos)
    return [row(word, position, limit) for word, limit in combos]


def write(name: str, rows: list[dict]) -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    path = HERE / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{path}: {len(rows)} rows")


def main() -> None:
    arithmetic = train_grpo_data().arithmetic_rows(2000, seed=1)
    random.Random(3).shuffle(arithmetic)
    write("a_validation.jsonl", arithmetic[:A_VALIDATION])
    write("a_train.jsonl", arithmetic[A_VALIDATION:])
    write("b_validation.jsonl", keyword_rows("anywhere"))
    write("c_validation.jsonl", keyword_rows("first"))


if __name__ == "__main__":
    main()
