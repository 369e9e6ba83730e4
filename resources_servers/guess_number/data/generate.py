"""Write guess_number's datasets: example.jsonl (5 rows), train.jsonl (500) and validation.jsonl (100).

Run from anywhere: ``python resources_servers/guess_number/data/generate.py`` writes all three next
to this file; ``--split NAME --output PATH [--rows N] [--seed S]`` writes one split elsewhere.
Seeded per split, so re-running reproduces the files byte for byte. Each row holds a ``game``
(range, hidden number, guess budget = what binary search needs plus ``--slack``); the model sees
only the system prompt and then the game's observations.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_parser, per_split, write_splits
from resources_servers.guess_number.app import GameSpec

HERE = Path(__file__).parent
AGENT = "guess_number_gymnasium_agent"
SPLITS = {"example": (5, 11), "train": (500, 12), "validation": (100, 13)}  # rows, seed
RANGES = [(1, 10), (1, 20), (1, 50), (1, 100), (1, 1000), (-50, 50)]

SYSTEM = (
    "You are playing a number-guessing game. Give exactly one guess per turn: reply with the number, "
    "for example <guess>42</guess>, or pass it as the action of the act tool when that tool is offered. "
    "Use the higher/lower hints to narrow the range, and never repeat a guess."
)


def build_rows(num_rows: int, seed: int, slack: int = 1) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        low, high = rng.choice(RANGES)
        spec = GameSpec(
            low=low,
            high=high,
            secret=rng.randint(low, high),
            max_guesses=(high - low + 1).bit_length() + slack,
        )
        rows.append(
            {
                "responses_create_params": {"input": [{"role": "system", "content": SYSTEM}]},
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "game": spec.model_dump(),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = generator_parser(__doc__, SPLITS, HERE)
    parser.add_argument("--rows", type=int, help="rows for --split (default: 5/500/100)")
    parser.add_argument("--seed", type=int, help="seed for --split (default: 11/12/13)")
    parser.add_argument("--slack", type=int, default=1, help="guesses beyond what binary search needs")
    args = parser.parse_args(argv)
    if (args.rows or args.seed is not None) and not args.split:
        parser.error("--rows and --seed need --split")

    def build(split: str) -> list[dict]:
        rows, seed = SPLITS[split]
        return build_rows(args.rows or rows, seed if args.seed is None else args.seed, args.slack)

    write_splits(args, SPLITS, per_split(build))


if __name__ == "__main__":
    main()
