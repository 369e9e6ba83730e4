"""One retry budget and one deadline per call chain, shared by every hop of it.

Without it each hop retries on its own: a collector, an agent and a model server with four attempts
each turn one rate-limited model turn into 64 upstream requests, and a model server keeps retrying
long after the agent that asked has given up. So the caller's remaining budget travels with every
request (``x-polygym-attempts``: attempts the callee may make in all; ``x-polygym-deadline-s``:
seconds left before the caller stops waiting), a server handles the request inside it
(``within``), and ``ServerClient`` never makes more attempts, or waits longer, than the budget
allows. The innermost hop does the retrying; a failure it gives up on comes back marked final
(``failure.FAILURE_HEADER``), and outer hops do not retry it again.

In-process calls need no headers: the callee's task starts from the caller's context, where the
client has already set the budget of that call.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Mapping
from types import TracebackType
from typing import NamedTuple

ATTEMPTS_HEADER = "x-polygym-attempts"
DEADLINE_HEADER = "x-polygym-deadline-s"
_MAX_ATTEMPTS = 100
_MAX_DEADLINE_S = 7 * 24 * 3600.0


class CallBudget(NamedTuple):
    """What the chain still allows: ``attempts`` in all, until ``deadline`` (``time.monotonic``).

    A named tuple, not a frozen dataclass: several are made per call, on every hop of every
    rollout, and a tuple is built in a fraction of a frozen dataclass's ``__init__``.
    """

    attempts: int | None = None
    deadline: float | None = None

    def narrowed(self, attempts: int, timeout_s: float) -> CallBudget:
        """This budget within a call's own limits: at most ``attempts``, ``timeout_s`` from now."""
        own_deadline = time.monotonic() + timeout_s
        return CallBudget(
            attempts=attempts if self.attempts is None else min(attempts, self.attempts),
            deadline=own_deadline if self.deadline is None else min(own_deadline, self.deadline),
        )

    def remaining_s(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def headers(self) -> dict[str, str]:
        """The budget as request headers for a callee in another process."""
        headers = {}
        if self.attempts is not None:
            headers[ATTEMPTS_HEADER] = str(self.attempts)
        if self.deadline is not None:
            headers[DEADLINE_HEADER] = f"{max(0.0, self.remaining_s()):.3f}"
        return headers


UNLIMITED = CallBudget()
_current: contextvars.ContextVar[CallBudget] = contextvars.ContextVar("polygym_budget", default=UNLIMITED)


def current() -> CallBudget:
    """The budget of the call being served (unlimited outside any call)."""
    return _current.get()


class within:
    """Run the block (a handler, a callee) inside ``budget``.

    A class, not a generator-based context manager: it is entered on every hop of every rollout,
    and ``contextlib.contextmanager``'s generator costs several times more per use.
    """

    __slots__ = ("_budget", "_token")

    def __init__(self, budget: CallBudget) -> None:
        self._budget = budget

    def __enter__(self) -> None:
        self._token = _current.set(self._budget)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        _current.reset(self._token)


async def pause(seconds: float, deadline: float) -> bool:
    """Sleep ``seconds`` before a retry, unless that would pass ``deadline``: then False at once,
    so a caller gives up with the reply in hand rather than waking after its caller has left."""
    if time.monotonic() + seconds >= deadline:
        return False
    await asyncio.sleep(seconds)
    return True


def from_headers(headers: Mapping[str, str]) -> CallBudget:
    """The budget a caller sent; a missing or malformed header means no limit from that side
    (the server's own timeouts and policies still apply)."""
    attempts = _number(headers.get(ATTEMPTS_HEADER), int, _MAX_ATTEMPTS)
    seconds = _number(headers.get(DEADLINE_HEADER), float, _MAX_DEADLINE_S)
    return CallBudget(
        attempts=None if attempts is None else max(1, int(attempts)),
        deadline=None if seconds is None else time.monotonic() + seconds,
    )


def _number(text: str | None, kind: type[int] | type[float], cap: float) -> float | None:
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        return None
    return min(float(value), cap) if math.isfinite(value) and value >= 0 else None
