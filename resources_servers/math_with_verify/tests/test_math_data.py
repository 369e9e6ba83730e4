"""The math datasets: sizes, row shape, disjoint splits, answers re-derived from the question text."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from polygym.testing import assert_generator_reproduces, read_splits

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SPLITS = {"example": 5, "train": 200, "validation": 50}
LOADED = read_splits(DATA_DIR, SPLITS)
ALL_ROWS = [row for rows in LOADED.values() for row in rows]
ANSWER = re.compile(r"^-?\d+(/\d+)?$")


def question(row: dict) -> str:
    return row["responses_create_params"]["input"][-1]["content"].split("\n\n")[0]


def solve_from_text(row: dict) -> Fraction | None:
    """Re-derive the answer from the question with sympy, independently of the generator's code."""
    text = question(row)
    if found := re.fullmatch(r"Solve for ([xy]): (.+) = (.+)\.", text):
        var = sympy.Symbol(found[1])
        lhs, rhs = (sympy.sympify(re.sub(r"(\d)([xy])", r"\1*\2", side)) for side in found.groups()[1:])
        (solution,) = sympy.solve(sympy.Eq(lhs, rhs), var)
        return Fraction(str(solution))
    if found := re.fullmatch(r"Compute (\d+/\d+) (.) (\d+/\d+)\.", text):
        a, b = Fraction(found[1]), Fraction(found[3])
        return {"+": a + b, "-": a - b, "\N{MULTIPLICATION SIGN}": a * b, "\N{DIVISION SIGN}": a / b}[
            found[2]
        ]
    if found := re.fullmatch(r"If x \+ y = (-?\d+) and x - y = (-?\d+), what is the value of x\?", text):
        x, y = sympy.symbols("x y")
        solution = sympy.solve([x + y - int(found[1]), x - y - int(found[2])], [x, y])
        return Fraction(str(solution[x]))
    if found := re.fullmatch(r"What is the arithmetic mean of (.+)\?", text):
        numbers = [int(n) for n in found[1].split(", ")]
        return Fraction(sum(numbers), len(numbers))
    return None


def test_splits_have_their_sizes_and_share_no_question():
    assert {split: len(rows) for split, rows in LOADED.items()} == SPLITS
    assert len({question(row) for row in ALL_ROWS}) == len(ALL_ROWS)


def test_rows_are_tool_free_and_well_formed():
    for row in ALL_ROWS:
        params = row["responses_create_params"]
        assert params.get("tools", []) == []
        assert [m["role"] for m in params["input"]] == ["system", "user"]
        prompt = params["input"][-1]["content"]
        assert "\\boxed{}" in prompt or "Answer: <value>" in prompt
        assert ANSWER.match(row["expected_answer"]), row["expected_answer"]
        assert Fraction(row["expected_answer"]) == Fraction(row["expected_answer"]).limit_denominator()
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "math_with_verify_simple_agent"}
    assert len({row["problem_type"] for row in ALL_ROWS}) >= 10
    assert any("/" in row["expected_answer"] for row in LOADED["example"])


@pytest.mark.slow
def test_answers_match_an_independent_solution():
    checked = 0
    for row in ALL_ROWS:
        solved = solve_from_text(row)
        if solved is not None:
            assert solved == Fraction(row["expected_answer"]), question(row)
            checked += 1
    assert checked >= 60


def test_generator_reproduces_every_file_byte_for_byte(tmp_path):
    assert_generator_reproduces(DATA_DIR, tmp_path)
