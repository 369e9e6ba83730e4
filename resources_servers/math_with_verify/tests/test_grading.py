"""The grading functions in-process (no worker pool): extraction anchors and canonical answers."""

from __future__ import annotations

import pytest

from resources_servers.math_with_verify.grading import answer_latex, grade


@pytest.mark.parametrize(
    ("text", "anchored", "unanchored"),
    [
        ("The answer is 7/6", True, True),
        ("Final answer: 7/6", True, True),
        ("So x = 7/6", False, True),
        ("7/6", False, True),
        ("Compute 3/2 - 3/9.", False, True),
    ],
)
def test_allow_unanchored_accepts_bare_expressions(text, anchored, unanchored):
    assert grade(text, "7/6", False, 2)["correct"] is anchored
    assert grade(text, "7/6", True, 2)["correct"] is unanchored


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Answer: 0.75", "3/4"),
        ("\\boxed{\\frac{6}{8}}", "3/4"),
        ("Answer: 12%", "3/25"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\sqrt{2}}", "sqrt(2)"),
        ("\\boxed{2\\pi}", "2*pi"),
    ],
)
def test_extracted_answers_are_canonical_so_equal_values_vote_together(text, canonical):
    assert grade(text, "1", False, 2)["extracted_answer"] == canonical


def test_reference_that_is_not_math_is_flagged():
    assert grade("Answer: 1", "???", False, 2)["gold_ok"] is False
    assert grade("Answer: 1", "\\boxed{}", False, 2)["gold_ok"] is False
    assert grade("Answer: 1", "1", False, 2)["gold_ok"] is True


def test_answer_latex():
    assert answer_latex("-35/6") == "-\\frac{35}{6}"
    assert answer_latex("57") == "57"
