"""Retry policy for outbound calls: which failures are transient, and how long to back off.

Transient means the same request may succeed if sent again unchanged: the connection failed or was
reset, the callee said 429 (slow down) or 502/503/504 (a proxy or overloaded server). A 500 is an
error in the callee's code (say, a verifier exception) and retrying only repeats it.

A callee that says when to come back (``Retry-After``, seconds or an HTTP date) is believed, up to
``max_retry_after_s``: a provider's rate limiter knows better than our backoff, but a hostile or
broken one must not park a rollout for an hour. The caller's deadline bounds the wait in any case
(see ``ServerClient``).
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass

TRANSIENT_STATUSES = frozenset({408, 429, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts."""

    attempts: int = 4
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    retry_statuses: frozenset[int] = TRANSIENT_STATUSES
    max_retry_after_s: float = MAX_RETRY_AFTER_S
    retry_after_send: bool = True
    """Retry a connection that broke after the request went out (a reset, a cut reply). False for
    calls that change state: only a refused connection then proves the request never arrived."""

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Sleep before retry number ``attempt`` (1-based): the callee's ``Retry-After`` when it
        sent one (capped), else random so callers do not stampede."""
        asked = retry_after_s(retry_after)
        if asked is not None:
            return min(asked, self.max_retry_after_s)
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return random.uniform(0, cap)

    def should_retry_status(self, status: int) -> bool:
        return status in self.retry_statuses


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


NO_RETRY = RetryPolicy(attempts=1)
