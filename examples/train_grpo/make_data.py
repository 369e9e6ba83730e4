"""Write the example run's training and validation rows for two shipped environments.

The shipped datasets are made for real policies; a 135M-parameter model scores zero on them, and a
policy that never scores gives GRPO nothing to learn from. So the example trains on easier rows
for the same environments, verifiers and agents:

- ``reasoning_gym``: one-digit ``basic_arithmetic`` (two terms, ``+``/``-``, no parentheses or
  negation), scored by reasoning-gym's own scorer, which gives partial credit
  ``len(answer) / len(reply)`` when the right number is inside a longer reply. Served with
  ``answer_format: tag_or_last_line`` (see ``blend.yaml``), so "3 + 5 = 8" scores 1/9 and a bare
  "8" (or ``<answer>8</answer>``) scores 1: the reward rises as answers get right *and* short.
- ``guess_number``: number-guessing games from 1 to 8 with 3 guesses (exactly what interval
  halving needs; random distinct guesses win 3 times in 8). Multi-turn: every guess is one model
  turn and every hint one environment turn, which exercises the token-level assembly and its
  contiguity check on a real tokenizer and chat template.

Run ``python examples/train_grpo/make_data.py``: deterministic, writes ``data/*.jsonl`` here.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import reasoning_gym

from resources_servers.guess_number.app import GameSpec

HERE = Path(__file__).resolve().parent / "data"
ARITHMETIC = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
ARITHMETIC_SYSTEM = "Give only the final answer inside answer tags, for example <answer>42</answer>."
GUESS_SYSTEM = "Guess the hidden number. Reply with one number only, for example <guess>4</guess>."


def arithmetic_rows(size: int, seed: int) -> list[dict]:
    """One row per distinct question among ``size`` generated ones (there are fewer than 200)."""
    config = {**ARITHMETIC, "size": size, "seed": seed}
    dataset = reasoning_gym.create_dataset("basic_arithmetic", **config)
    rows, seen = [], set()
    for index in range(size):
        entry = dataset[index]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        rows.append(
            {
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": ARITHMETIC_SYSTEM},
                        {"role": "user", "content": entry["question"]},
                    ],
                    "max_output_tokens": 24,
                },
                "task": "basic_arithmetic",
                "task_config": config,
                "entry": {
                    "question": entry["question"],
                    "answer": entry["answer"],
                    "metadata": entry["metadata"],
                },
            }
        )
    return rows


def guess_rows(size: int, seed: int, low: int = 1, high: int = 8, guesses: int = 3) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        game = GameSpec(low=low, high=high, secret=rng.randint(low, high), max_guesses=guesses)
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "system", "content": GUESS_SYSTEM}],
                    "max_output_tokens": 12,
                },
                "game": game.model_dump(),
            }
        )
    return rows


def write(name: str, rows: list[dict]) -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    path = HERE / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{path}: {len(rows)} rows")


def main() -> None:
    # every distinct question once, a random 32 of them held out: validation questions are unseen
    rows = arithmetic_rows(2000, seed=1)
    random.Random(0).shuffle(rows)
    validation, train = rows[:32], rows[32:]
    write("arithmetic_train.jsonl", train)
    write("arithmetic_validation.jsonl", validation)
    write("guess_train.jsonl", guess_rows(200, seed=1))
    write("guess_validation.jsonl", guess_rows(32, seed=2))


if __name__ == "__main__":
    main()
