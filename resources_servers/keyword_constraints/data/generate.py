"""Write the keyword-sentence datasets: example (5), train (150), validation (50) and heldout (50).

Run from anywhere: ``python resources_servers/keyword_constraints/data/generate.py`` writes every
split next to this file; ``--output PATH`` writes one split (``--split``, default ``example``) to
PATH; ``--output-dir DIR`` writes them all into DIR. Seeded: re-running reproduces every file byte
for byte.

Each row asks for one sentence that holds a keyword and has at most ``max_words`` words. Train and
example rows draw keywords from one pool, validation and heldout rows from another (validation
measures the instruction, not memorized keywords). ``heldout`` is a variant never meant to be
trained on: the keyword must be the sentence's *first* word, which shows whether what training
did to the instruction carries over to a wording it never saw.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main

SEED = 1818
SPLITS = {"example": 5, "train": 150, "validation": 50, "heldout": 50}
DATA_DIR = Path(__file__).resolve().parent
AGENT = "keyword_constraints_simple_agent"
SYSTEM = "Follow the instruction exactly. Reply with the sentence only."
MAX_WORDS = (15, 20, 25)
MAX_OUTPUT_TOKENS = 48
"""Enough for any allowed sentence (25 words are about 35 tokens); a longer reply fails anyway."""

TRAIN_WORDS = [
    "apple",
    "bridge",
    "candle",
    "desert",
    "engine",
    "forest",
    "garden",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "market",
    "needle",
    "orange",
    "pencil",
    "rabbit",
    "saddle",
    "tunnel",
    "valley",
    "wagon",
    "window",
    "yellow",
    "zebra",
    "anchor",
    "basket",
    "castle",
    "dragon",
    "feather",
    "guitar",
    "hammer",
    "lantern",
    "mirror",
    "pepper",
    "rocket",
    "silver",
    "tiger",
    "violin",
    "winter",
    "blanket",
    "carpet",
    "helmet",
    "jungle",
    "lemon",
    "magnet",
    "noodle",
    "parrot",
    "puzzle",
    "spider",
    "tomato",
    "wallet",
]
HELD_WORDS = [
    "river",
    "cloud",
    "music",
    "bread",
    "stone",
    "horse",
    "paper",
    "smile",
    "ocean",
    "summer",
    "doctor",
    "train",
    "coffee",
    "planet",
    "flower",
    "teacher",
    "mountain",
    "letter",
    "kitchen",
    "bottle",
]


def instruction(keyword: str, position: str, max_words: int) -> str:
    where = f'starts with the word "{keyword}"' if position == "first" else f'contains the word "{keyword}"'
    return f"Write one sentence that {where} and has at most {max_words} words."


def row(keyword: str, position: str, max_words: int) -> dict:
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": instruction(keyword, position, max_words)},
            ],
            "max_output_tokens": MAX_OUTPUT_TOKENS,
        },
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "keyword": keyword,
        "position": position,
        "max_words": max_words,
    }


def build_splits(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split from one seeded stream; no (keyword, position, limit) appears twice in a split."""
    rng = random.Random(seed)
    plan = {
        "example": (TRAIN_WORDS, "anywhere"),
        "train": (TRAIN_WORDS, "anywhere"),
        "validation": (HELD_WORDS, "anywhere"),
        "heldout": (HELD_WORDS, "first"),
    }
    splits: dict[str, list[dict]] = {}
    for split, size in SPLITS.items():
        words, position = plan[split]
        combos = [(w, n) for w in words for n in MAX_WORDS]
        rng.shuffle(combos)
        if len(combos) < size:
            raise ValueError(f"{split}: only {len(combos)} distinct rows for {size}")
        splits[split] = [row(word, position, limit) for word, limit in combos[:size]]
    return splits


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: build_splits(), SPLITS, DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
