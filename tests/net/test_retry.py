"""Retry-After is believed (seconds or an HTTP date), capped, and ignored when unusable."""

from __future__ import annotations

import email.utils

import pytest

from polygym.net.retry import RetryPolicy, retry_after_s

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        ("0.5", 0.5),
        (email.utils.formatdate(NOW + 12, usegmt=True), 12.0),
        (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),  # a date in the past: now
        ("-3", 0.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_retry_after_is_read_as_seconds_or_a_date(header: str | None, seconds: float | None) -> None:
    assert retry_after_s(header, now=NOW) == seconds


def test_the_delay_follows_retry_after_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay_s=0.001, max_delay_s=0.002, max_retry_after_s=30)
    assert policy.delay(1, "7") == 7.0
    assert policy.delay(1, "3600") == 30.0  # a hostile or broken limiter cannot park a rollout for an hour
    assert 0 <= policy.delay(1, "whenever") <= 0.002  # unusable: the usual jittered backoff
