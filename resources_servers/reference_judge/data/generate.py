"""Write the reference_judge datasets: example (5 rows), train (100) and validation (25), disjoint.

Run from anywhere: ``python resources_servers/reference_judge/data/generate.py`` writes all three
splits next to this file; ``--output PATH`` writes one split (``--split``, default ``example``);
``--output-dir DIR`` all three. Seeded, so re-running reproduces every file byte for byte.

Questions are computed (unit conversions, sums, day-of-week arithmetic), so every reference answer
is right by construction; the policy is asked for a short sentence, which only a judge can grade
(an exact-match verifier would fail "It is 180 minutes." against "180 minutes").
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main

SEED = 5151
SPLITS = {"example": 5, "train": 100, "validation": 25}
DATA_DIR = Path(__file__).resolve().parent
AGENT = "reference_judge_simple_agent"
SYSTEM = "Answer the question in one short sentence."
UNITS = [
    ("hours", "minutes", 60),
    ("kilometers", "meters", 1000),
    ("days", "hours", 24),
    ("weeks", "days", 7),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def conversion(rng: random.Random) -> tuple[str, str, str]:
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 40)
    return "unit_conversion", f"How many {small} are in {n} {big}?", f"{n * factor} {small}"


def addition(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return "arithmetic", f"What is {a} plus {b}?", str(a + b)


def weekday(rng: random.Random) -> tuple[str, str, str]:
    start, later = rng.randrange(7), rng.randint(2, 60)
    question = f"If today is {DAYS[start]}, what day of the week is it in {later} days?"
    return "calendar", question, DAYS[(start + later) % 7]


GENERATORS: list[Callable[[random.Random], tuple[str, str, str]]] = [conversion, addition, weekday]


def build_row(category: str, question: str, reference: str) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        },
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "question": question,
        "reference_answer": reference,
        "category": category,
    }


def build_splits(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split from one seeded stream; no question appears twice anywhere."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {}
    made = 0
    for split, size in SPLITS.items():
        rows: list[dict] = []
        while len(rows) < size:
            category, question, reference = GENERATORS[made % len(GENERATORS)](rng)
            made += 1
            if question not in seen:
                seen.add(question)
                rows.append(build_row(category, question, reference))
        splits[split] = rows
    return splits


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: build_splits(), SPLITS, DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
