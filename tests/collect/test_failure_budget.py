"""``--max-failures N|N%``: one parser and one rule for every command that runs rollouts."""

from __future__ import annotations

from fractions import Fraction

import pytest

from polygym.collect.failure_budget import NO_FAILURES, FailureBudget, FailureBudgetError


def test_the_default_allows_no_failure() -> None:
    assert NO_FAILURES.allows(0, 10)
    assert not NO_FAILURES.allows(1, 10)


def test_a_count_allows_that_many() -> None:
    budget = FailureBudget.parse("3")
    assert budget.allows(3, 4) and not budget.allows(4, 100)


@pytest.mark.parametrize(
    ("failed", "sent", "allowed"),
    [(1, 20, True), (2, 20, False), (1, 19, False), (0, 0, True), (5, 100, True), (6, 100, False)],
)
def test_a_rate_allows_exactly_its_share(failed: int, sent: int, allowed: bool) -> None:
    """5% of 20 is exactly 1 (allowed); 1 of 19 is 5.26% (not): compared exactly, not in floats."""
    assert FailureBudget.parse("5%").allows(failed, sent) is allowed


def test_a_fractional_rate_is_exact() -> None:
    budget = FailureBudget.parse("0.1%")
    assert budget.share == Fraction(1, 1000)
    assert budget.allows(1, 1000) and not budget.allows(2, 1000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-1", "'-1' must be at least 0"),
        ("abc", "'abc' is not a whole number or a percentage (N%)"),
        ("101%", "'101%' must be from 0% to 100%"),
        ("x%", "'x%' is not a percentage"),
        ("1.5", "'1.5' is not a whole number"),
    ],
)
def test_a_bad_value_is_named(text: str, message: str) -> None:
    with pytest.raises(FailureBudgetError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        FailureBudget.parse(text)


def test_the_verdict_counts_by_class_and_says_why() -> None:
    refused = NO_FAILURES.verdict(5, 5, {"ConnectionRefused": 4, "HTTP 422": 1})
    assert not refused.ok
    assert refused.line.startswith("5 of 5 rollouts failed (ConnectionRefused: 4, HTTP 422: 1): more than")
    assert "--max-failures 0" in refused.line
    allowed = FailureBudget.parse("50%").verdict(1, 2, {"Timeout": 1})
    assert allowed.ok and allowed.line == "1 of 2 rollouts failed (Timeout: 1): within --max-failures 50%."
    assert NO_FAILURES.verdict(0, 7, {}).line == "0 of 7 rollouts failed."
