"""Write the math datasets: example (5 rows), train (200) and validation (50), all disjoint.

Run from anywhere: ``python resources_servers/math_with_verify/data/generate.py`` writes all three
splits next to this file; ``--output PATH`` writes one split (``--split``, default ``example``) to
PATH; ``--output-dir DIR`` writes all three into DIR. Seeded, so re-running reproduces every file
byte for byte.

Every problem is built from random parameters and its answer computed exactly with
``fractions.Fraction``, so answers are right by construction. Answers are integers or reduced
fractions written ``p/q`` (``-5/2``), the form ``expected_answer`` uses.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main

SEED = 31337
SPLITS = {"example": 5, "train": 200, "validation": 50}
DATA_DIR = Path(__file__).resolve().parent
AGENT = "math_with_verify_simple_agent"

SYSTEM = "You are a careful mathematician. Reason step by step, then state one exact final answer."
BOXED = (
    "Give the final answer as an exact number (a fraction in lowest terms if it is not a whole "
    "number) inside \\boxed{}."
)
ANSWER_LINE = (
    "Finish with a last line of the form 'Answer: <value>', giving the exact value (a fraction in "
    "lowest terms if it is not a whole number)."
)

NAMES = ["Ada", "Bruno", "Chiara", "Dev", "Elif", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Keiko", "Luis"]
ITEMS = ["sticker", "marble", "pencil", "stamp", "shell", "card"]
LIQUIDS = ["lemonade", "water", "soup", "tea", "milk"]
THINGS = ["jacket", "lamp", "backpack", "bicycle helmet", "desk chair", "kettle"]
VEHICLES = ["train", "bus", "cyclist", "ferry", "delivery van"]

Problem = tuple[str, str, Fraction]  # (problem type, question, exact answer)


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    value = 0
    while value == 0:
        value = rng.randint(low, high)
    return value


def _term(coefficient: int, variable: str) -> str:
    """``3x``, ``-x``, ``x``: a linear term as people write it."""
    if coefficient == 1:
        return variable
    if coefficient == -1:
        return f"-{variable}"
    return f"{coefficient}{variable}"


def _plus(constant: int) -> str:
    return f"+ {constant}" if constant >= 0 else f"- {-constant}"


def packs(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    n, k = rng.randint(3, 15), rng.randint(4, 24)
    given = rng.randint(1, n * k - 1)
    question = (
        f"{name} buys {n} packs of {k} {item}s and gives {given} of them to friends. "
        f"How many {item}s does {name} have left?"
    )
    return "word_arithmetic", question, Fraction(n * k - given)


def share(rng: random.Random) -> Problem:
    liquid, total, jugs = rng.choice(LIQUIDS), rng.randint(5, 60), rng.randint(2, 12)
    question = (
        f"{total} liters of {liquid} are poured equally into {jugs} jugs. How many liters end up in each jug?"
    )
    return "word_division", question, Fraction(total, jugs)


def linear(rng: random.Random) -> Problem:
    a, b, c = _nonzero(rng, -12, 12), _nonzero(rng, -30, 30), rng.randint(-50, 50)
    return "linear_equation", f"Solve for x: {_term(a, 'x')} {_plus(b)} = {c}.", Fraction(c - b, a)


def both_sides(rng: random.Random) -> Problem:
    a, c = _nonzero(rng, -9, 9), _nonzero(rng, -9, 9)
    while c == a:
        c = _nonzero(rng, -9, 9)
    b, d = rng.randint(-25, 25), rng.randint(-25, 25)
    question = f"Solve for y: {_term(a, 'y')} {_plus(b)} = {_term(c, 'y')} {_plus(d)}."
    return "linear_equation", question, Fraction(d - b, a - c)


def fraction_arithmetic(rng: random.Random) -> Problem:
    p, q = rng.randint(1, 9), rng.randint(2, 12)
    r, s = rng.randint(1, 9), rng.randint(2, 12)
    symbol, op = rng.choice(
        [
            ("+", Fraction.__add__),
            ("-", Fraction.__sub__),
            ("\N{MULTIPLICATION SIGN}", Fraction.__mul__),
            ("\N{DIVISION SIGN}", Fraction.__truediv__),
        ]
    )
    question = f"Compute {p}/{q} {symbol} {r}/{s}."
    return "fractions", question, op(Fraction(p, q), Fraction(r, s))


def discount(rng: random.Random) -> Problem:
    thing, price = rng.choice(THINGS), rng.randint(12, 400)
    percent = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 60, 75])
    question = (
        f"A {thing} costs ${price}. During a sale it is {percent}% off. What is the sale price in dollars?"
    )
    return "percentages", question, Fraction(price * (100 - percent), 100)


def travel(rng: random.Random) -> Problem:
    vehicle, speed, minutes = rng.choice(VEHICLES), rng.randint(12, 120), rng.choice(range(10, 240, 5))
    question = (
        f"A {vehicle} moves at a steady {speed} km/h for {minutes} minutes. "
        "How many kilometers does it cover?"
    )
    return "rates", question, Fraction(speed * minutes, 60)


def mean(rng: random.Random) -> Problem:
    numbers = [rng.randint(-20, 60) for _ in range(rng.randint(3, 6))]
    question = f"What is the arithmetic mean of {', '.join(map(str, numbers))}?"
    return "statistics", question, Fraction(sum(numbers), len(numbers))


def system(rng: random.Random) -> Problem:
    total, difference = rng.randint(-30, 60), rng.randint(-30, 30)
    question = f"If x + y = {total} and x - y = {difference}, what is the value of x?"
    return "linear_system", question, Fraction(total + difference, 2)


def rectangle(rng: random.Random) -> Problem:
    width = rng.randint(2, 30)
    length = rng.randint(width + 1, 45)
    question = (
        f"A rectangle has a perimeter of {2 * (width + length)} cm and a width of {width} cm. "
        "What is its area in square centimeters?"
    )
    return "geometry", question, Fraction(width * length)


def consecutive(rng: random.Random) -> Problem:
    count, start = rng.randint(3, 6), rng.randint(-20, 80)
    total = sum(range(start, start + count))
    question = f"The sum of {count} consecutive integers is {total}. What is the largest of them?"
    return "number_theory", question, Fraction(start + count - 1)


def ratio(rng: random.Random) -> Problem:
    red, blue = rng.randint(1, 9), rng.randint(1, 9)
    while Fraction(red, blue).denominator != blue or red == blue:  # a ratio in lowest terms
        red, blue = rng.randint(1, 9), rng.randint(1, 9)
    scale = rng.randint(2, 15)
    question = (
        f"The ratio of red to blue marbles in a bag is {red}:{blue}. "
        f"There are {(red + blue) * scale} marbles in total. How many are blue?"
    )
    return "ratios", question, Fraction(blue * scale)


GENERATORS: list[Callable[[random.Random], Problem]] = [
    packs,
    share,
    linear,
    both_sides,
    fraction_arithmetic,
    discount,
    travel,
    mean,
    system,
    rectangle,
    consecutive,
    ratio,
]


def format_answer(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def build_splits(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split from one seeded stream; no question appears twice anywhere."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {}
    for split, size in SPLITS.items():
        rows: list[dict] = []
        while len(rows) < size:
            problem_type, question, answer = GENERATORS[len(seen) % len(GENERATORS)](rng)
            if question in seen:
                continue
            seen.add(question)
            instruction = BOXED if rng.random() < 0.75 else ANSWER_LINE
            rows.append(
                {
                    "responses_create_params": {
                        "input": [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"{question}\n\n{instruction}"},
                        ]
                    },
                    "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                    "expected_answer": format_answer(answer),
                    "problem_type": problem_type,
                }
            )
        splits[split] = rows
    return splits


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: build_splits(), SPLITS, DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
