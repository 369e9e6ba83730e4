"""Write data/example.jsonl: five synonym-value tasks of 3 to 5 words each.

Run from anywhere: ``python resources_servers/example_multi_step/data/generate.py``
(``--output PATH`` to write elsewhere). Seeded, so re-running reproduces the file byte for byte;
expected values come from the server's own ``synonym_value`` and tool schemas from the server
class, so neither can drift from the code.

Every prompt holds ``synonyms: w1, w2, w3.`` (the words joined by ``, ``, ended by ``.``): scripted
test policies read the words with that pattern, so keep it when adding templates.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main
from resources_servers.example_multi_step.app import ExampleMultiStep, synonym_value

SEED = 7321
NUM_ROWS = 5
DATA_DIR = Path(__file__).resolve().parent
AGENT = "example_multi_step_simple_agent"

SYSTEM = (
    "You solve lookup tasks with tools. Never guess a value: every value must come from a tool "
    "result. Call one tool at a time if you are unsure about the order."
)
WORDS = [
    "happy", "quick", "bright", "calm", "brave", "clever", "gentle", "large", "quiet", "sharp",
    "ancient", "eager", "fragile", "humble", "loyal", "rapid", "silent", "tidy", "vast", "witty",
]  # fmt: skip
TEMPLATES = [
    "Here are some synonyms: {words}. Look up the synonym value of each one with get_synonym_value, "
    "then submit all the values in the same order with a single extract_synonym_values call.",
    "I need the values for these synonyms: {words}. Use get_synonym_value on every word, and when "
    "you have them all, report them with extract_synonym_values, keeping the order of the list.",
    "Please work through these synonyms: {words}. For each word call get_synonym_value; afterwards call "
    "extract_synonym_values once with the values listed in the same order as the words.",
]


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    tools = ExampleMultiStep.tool_schemas()
    rows = []
    while len(rows) < NUM_ROWS:
        words = rng.sample(WORDS, rng.randint(3, 5))
        values = [synonym_value(w) for w in words]
        if len(set(values)) != len(values):  # equal values would make set_overlap ambiguous
            continue
        prompt = TEMPLATES[len(rows) % len(TEMPLATES)].format(words=", ".join(words))
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": prompt}],
                    "tools": tools,
                },
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "expected_synonyms": words,
                "expected_synonym_values": values,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: {"example": build_rows()}, ["example"], DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
