"""Write the multiple-choice datasets: example (5 rows), train (200) and validation (50), disjoint.

Run from anywhere: ``python resources_servers/mcqa/data/generate.py`` writes all three splits next
to this file; ``--output PATH`` writes one split (``--split``, default ``example``) to PATH;
``--output-dir DIR`` writes all three into DIR. Seeded, so re-running reproduces every file byte
for byte.

Questions are computed, not recalled: unit conversions, arithmetic, percentages, primes, greatest
common divisors, fraction comparison, Roman numerals, square roots and clock times. The right
option is computed exactly and every distractor is checked to differ from it, so each question
has exactly one correct option by construction. The correct letter is drawn uniformly.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main

SEED = 4242
SPLITS = {"example": 5, "train": 200, "validation": 50}
DATA_DIR = Path(__file__).resolve().parent
AGENT = "mcqa_simple_agent"
LABELS = "ABCDE"

SYSTEM = "You answer multiple-choice questions. Exactly one option is correct."
INSTRUCTION = "Think it through, then give the letter of the correct option inside \\boxed{}."

# (larger unit, smaller unit, how many smaller units make one larger unit)
UNITS = [
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("centimeters", "millimeters", 10),
    ("kilograms", "grams", 1000),
    ("tonnes", "kilograms", 1000),
    ("liters", "milliliters", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
]
ROMAN = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]  # fmt: skip

Question = tuple[str, str, str, list[str]]  # (category, question, correct text, distractor texts)


def number(value: Fraction) -> str:
    """An exact number as people write it: ``12``, ``4.5``, ``0.125`` (terminating decimals only)."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    while denominator % 2 == 0:
        denominator //= 2
    while denominator % 5 == 0:
        denominator //= 5
    if denominator != 1:
        raise ValueError(f"{value} has no terminating decimal form")
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    return f"{float(value):.{digits}f}"


def numeric_distractors(correct: Fraction, candidates: list[Fraction]) -> list[str]:
    """Candidate wrong answers as text, topped up with near misses so there are always six."""
    pool = list(dict.fromkeys(c for c in candidates if c != correct and c > 0))
    step = max(1, abs(correct.numerator // correct.denominator) // 10)
    k = 1
    while len(pool) < 6:
        pool += [c for c in (correct + k * step, correct - k * step) if c > 0 and c not in pool]
        k += 1
    return [number(c) for c in pool]


def unit_conversion(rng: random.Random) -> Question:
    big, small, factor = rng.choice(UNITS)
    amount = Fraction(rng.randint(2, 60)) + rng.choice([0, 0, Fraction(1, 2), Fraction(1, 4)])
    if rng.random() < 0.5:
        correct = amount * factor
        question = f"How many {small} are in {number(amount)} {big}?"
        wrong = [
            correct / 10,
            correct * 10,
            amount * 100,
            amount + factor,
            correct + factor,
            correct - factor,
        ]
    else:
        amount = amount * factor if rng.random() < 0.5 else Fraction(rng.randint(2, 40) * 5)
        while number_is_awkward(amount / factor):
            amount += 5
        correct = amount / factor
        question = f"How many {big} are in {number(amount)} {small}?"
        wrong = [correct * 10, correct / 10, amount / 100, amount * factor, correct + 1, correct * 2]
    wrong = [w for w in wrong if not number_is_awkward(w)]
    return "unit_conversion", question, number(correct), numeric_distractors(correct, wrong)


def number_is_awkward(value: Fraction) -> bool:
    """True for values without a short decimal form (1/3, or more than three decimals)."""
    return (value * 1000).denominator != 1


def arithmetic(rng: random.Random) -> Question:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    if rng.random() < 0.5:
        correct = a * b
        question = f"What is {a} \N{MULTIPLICATION SIGN} {b}?"
        wrong = [correct + 10, correct - 10, correct + a, correct - b, a * (b + 1), (a + 1) * b]
    else:
        a, b = a * 7 + rng.randint(0, 6), b * 3
        correct = a + b
        question = f"What is {a} + {b}?"
        wrong = [correct + 10, correct - 10, correct + 1, correct - 1, correct + 100]
    return (
        "arithmetic",
        question,
        str(correct),
        numeric_distractors(Fraction(correct), list(map(Fraction, wrong))),
    )


def percent_of(rng: random.Random) -> Question:
    percent, base = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 75, 80]), rng.randint(2, 40) * 20
    correct = Fraction(percent * base, 100)
    question = f"What is {percent}% of {base}?"
    wrong = [correct * 10, correct / 10, Fraction(base, percent), base - correct, correct + percent]
    wrong = [w for w in wrong if not number_is_awkward(w)]
    return "percentages", question, number(correct), numeric_distractors(correct, wrong)


def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def prime(rng: random.Random) -> Question:
    primes = [n for n in range(23, 300) if is_prime(n)]
    # Odd composites not divisible by 5: they look prime at a glance.
    lookalikes = [n for n in range(21, 300, 2) if not is_prime(n) and n % 5]
    correct = rng.choice(primes)
    wrong = rng.sample(lookalikes, 6)
    return "primes", "Which of these numbers is prime?", str(correct), list(map(str, wrong))


def gcd(rng: random.Random) -> Question:
    divisor = rng.randint(2, 18)
    x, y = rng.randint(2, 12), rng.randint(2, 12)
    while math.gcd(x, y) != 1 or x == y:
        x, y = rng.randint(2, 12), rng.randint(2, 12)
    a, b = divisor * x, divisor * y
    correct = math.gcd(a, b)
    question = f"What is the greatest common divisor of {a} and {b}?"
    wrong = [correct * 2, correct + 1, correct - 1, min(a, b), x * y, divisor * x * y]
    return (
        "divisibility",
        question,
        str(correct),
        numeric_distractors(Fraction(correct), list(map(Fraction, wrong))),
    )


def largest_fraction(rng: random.Random) -> Question:
    values: dict[Fraction, str] = {}
    while len(values) < 5:
        q = rng.randint(2, 12)
        p = rng.randint(1, q - 1)
        values.setdefault(Fraction(p, q), f"{p}/{q}")
    ordered = sorted(values)
    return (
        "fractions",
        "Which of these fractions is the largest?",
        values[ordered[-1]],
        [values[v] for v in ordered[:-1]],
    )


def roman(n: int) -> str:
    out = []
    for value, letters in ROMAN:
        while n >= value:
            out.append(letters)
            n -= value
    return "".join(out)


def roman_numeral(rng: random.Random) -> Question:
    n = rng.randint(14, 2999)
    wrong = [roman(n + d) for d in (-10, -1, 1, 4, 10, 40, 100, -100) if 0 < n + d < 4000]
    return "roman_numerals", f"Which Roman numeral stands for {n}?", roman(n), wrong


def square_root(rng: random.Random) -> Question:
    root = rng.randint(11, 60)
    wrong = [root - 1, root + 1, root + 2, root - 2, root * 2, root + 10]
    question = f"What is the square root of {root * root}?"
    return "square_roots", question, str(root), list(map(str, wrong))


def clock(rng: random.Random) -> Question:
    start = rng.randint(0, 23) * 60 + rng.choice(range(0, 60, 5))
    hours, minutes = rng.randint(1, 9), rng.choice(range(5, 60, 5))
    end = (start + hours * 60 + minutes) % (24 * 60)

    def hhmm(total: int) -> str:
        total %= 24 * 60
        return f"{total // 60:02d}:{total % 60:02d}"

    question = (
        f"On a 24-hour clock it is {hhmm(start)}. What time will it be {hours} hours and "
        f"{minutes} minutes later?"
    )
    wrong = [hhmm(end + d) for d in (-60, 60, -minutes, 15, -15, 12 * 60, 120)]
    return "clock_times", question, hhmm(end), wrong


GENERATORS: list[Callable[[random.Random], Question]] = [
    unit_conversion,
    arithmetic,
    percent_of,
    prime,
    gcd,
    largest_fraction,
    roman_numeral,
    square_root,
    clock,
]


def build_row(rng: random.Random, category: str, question: str, correct: str, wrong: list[str]) -> dict:
    distractors = [w for w in dict.fromkeys(wrong) if w != correct]
    count = 5 if rng.random() < 0.25 else 4
    texts = [*rng.sample(distractors, count - 1)]
    position = rng.randrange(count)
    texts.insert(position, correct)
    options = [{label: text} for label, text in zip(LABELS, texts, strict=False)]
    listing = "\n".join(f"{label}) {text}" for label, text in zip(LABELS, texts, strict=False))
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{question}\n\n{listing}\n\n{INSTRUCTION}"},
            ]
        },
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "question": question,
        "options": options,
        "expected_answer": LABELS[position],
        "category": category,
    }


def build_splits(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split from one seeded stream; no (question, option set) appears twice anywhere."""
    rng = random.Random(seed)
    seen: set[tuple[str, frozenset[str]]] = set()
    splits: dict[str, list[dict]] = {}
    made = 0
    for split, size in SPLITS.items():
        rows: list[dict] = []
        while len(rows) < size:
            category, question, correct, wrong = GENERATORS[made % len(GENERATORS)](rng)
            row = build_row(rng, category, question, correct, wrong)
            key = (question, frozenset(text for option in row["options"] for text in option.values()))
            if key in seen:
                continue
            seen.add(key)
            rows.append(row)
            made += 1
        splits[split] = rows
    return splits


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: build_splits(), SPLITS, DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
