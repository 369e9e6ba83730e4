"""Write data/example.jsonl: five weather questions, each answerable with one get_weather call.

Run from anywhere: ``python resources_servers/example_single_tool_call/data/generate.py``
(``--output PATH`` to write elsewhere). Seeded, so re-running reproduces the file byte for byte;
tool schemas come from the server class so they never drift from the code.

Every prompt holds ``weather in <City>`` followed directly by ``?``, ``.``, ``,`` or ``!``: scripted
test policies find the city with that pattern, so keep it when adding templates.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main
from resources_servers.example_single_tool_call.app import ExampleSingleToolCall

SEED = 20240611
NUM_ROWS = 5
DATA_DIR = Path(__file__).resolve().parent
AGENT = "example_single_tool_call_simple_agent"

SYSTEM = (
    "You are a helpful travel assistant. You cannot know current conditions yourself: call the "
    "get_weather tool for the city the user asks about, then answer in one or two sentences."
)
CITIES = ["Lisbon", "New York", "Oslo", "Buenos Aires", "Kyoto", "Cape Town", "Reykjavik", "Mexico City"]
TEMPLATES = [
    "Could you tell me the weather in {city}?",
    "I'm flying out tomorrow, what is the weather in {city}?",
    "Please check the weather in {city}. I need to decide what to pack.",
    "Quick question about the weather in {city}, is it a good day for a walk?",
    "I'd love to know the weather in {city}!",
    "Before my meeting I want the weather in {city}, thanks.",
]


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    cities = rng.sample(CITIES, NUM_ROWS)
    templates = rng.sample(TEMPLATES, NUM_ROWS)
    tools = ExampleSingleToolCall.tool_schemas()
    return [
        {
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": template.format(city=city)},
                ],
                "tools": tools,
            },
            "agent_ref": {"type": "responses_api_agents", "name": AGENT},
            "expected_city": city,
        }
        for city, template in zip(cities, templates, strict=True)
    ]


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: {"example": build_rows()}, ["example"], DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
