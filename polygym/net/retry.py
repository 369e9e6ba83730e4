"""Retry policy for outbound calls: which failures are transient, and how long to back off.

Transient means the same request may succeed if sent again unchanged: the connection failed or was
reset, the callee said 429 (slow down) or 502/503/504 (a proxy or overloaded server). A 500 is an
error in the callee's code (say, a verifier exception) and retrying only repeats it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TRANSIENT_STATUSES = frozenset({408, 429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts."""

    attempts: int = 4
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    retry_statuses: frozenset[int] = TRANSIENT_STATUSES

    def delay(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1-based); random so callers do not stampede."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return random.uniform(0, cap)

    def should_retry_status(self, status: int) -> bool:
        return status in self.retry_statuses


NO_RETRY = RetryPolicy(attempts=1)
