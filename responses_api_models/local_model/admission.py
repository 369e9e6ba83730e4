"""Which waiting request generates next on the embedded model: one uncached prompt prefix filled at
a time, and the conversations that started first finish first.

Measured on a 2-core machine under load with llama.cpp on one thread (the quickstart's first turns:
~220 prompt tokens, most of them the system prompt and tools every row of an environment shares):
one first turn alone took 33 s cold and 7 s once that shared prefix was cached; eight admitted
together took ~200 s each, because every slot processed the whole shared prefix on its own
(llama.cpp's prompt cache is filled when a generation ends, so none of the eight could reuse
another's). Prompt processing dominates on a CPU and gains little from batching, so the first
rollout came only after every first turn of the run. Two rules, and no extra work:

* **One cold prompt at a time.** Requests are keyed by the start of their prompt (``prefix_key``:
  an environment's system prompt). While the first request of a key has not finished, the others
  of that key wait; after it, they find the prefix cached (slots.py copies it into their slots)
  and process only what differs (the user's message). Nor does the first request of another key
  start meanwhile: two cold prompts in one batch take as long as one after the other on a CPU,
  so together both end late, one after the other the first ends at half the time (the
  quickstart's two environments: the first rollout's first turn no longer waits for the other
  environment's prompt). Requests of cached keys (twins, later turns) are not held back.
* **Oldest conversation first.** A waiting request of a conversation seen earlier (by the
  session cookie agents send with model calls) takes a free slot before one of a later
  conversation, so a rollout's next turn does not queue behind the first turns of rollouts that
  have not started: rollouts finish in about the order they began, the first one early. Requests
  without a session are ordered by arrival.

At most ``n_parallel`` requests generate at once, as before; only the order differs, and a key's
first request runs without its twins or other cold prompts.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import OrderedDict

MAX_REMEMBERED = 10_000
"""Conversations (and prefixes) remembered at most, oldest forgotten first: far above what is in flight."""
PREFIX_TOKENS = 48
"""Prompt tokens that key a prefix: past the chat template's opening, into the system prompt."""


def prefix_key(prompt_ids: list[int]) -> tuple[int, ...]:
    """What requests that would share a cached prefix have in common: their first tokens."""
    return tuple(prompt_ids[:PREFIX_TOKENS])


class Admission:
    """At most ``slots`` holders at once, one of them filling an uncached prefix; waiters by
    conversation age."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.busy = 0
        self._waiting: list[tuple[int, int, tuple[int, ...], asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._ranks: OrderedDict[str, int] = OrderedDict()
        self._cached: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._filling: set[tuple[int, ...]] = set()
        """The prefix whose first request runs now (at most one)."""

    def rank(self, session: str | None) -> int:
        """The conversation's place: when its session was first seen (a new one: now)."""
        arrival = next(self._arrivals)
        if session is None:
            return arrival
        if session not in self._ranks:
            self._ranks[session] = arrival
            if len(self._ranks) > MAX_REMEMBERED:
                self._ranks.popitem(last=False)
        return self._ranks[session]

    async def acquire(self, session: str | None, key: tuple[int, ...]) -> None:
        """Wait for a slot, behind every waiter of an older conversation that may start."""
        granted = asyncio.get_running_loop().create_future()
        bisect.insort(self._waiting, (self.rank(session), next(self._arrivals), key, granted))
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(key, ran=False)  # granted, then cancelled before it ran: pass it on
            raise

    def release(self, key: tuple[int, ...], ran: bool) -> None:
        """Free a slot; a request that ran leaves its prefix cached. Then grant the free slots."""
        self.busy -= 1
        self._filling.discard(key)
        if ran:
            self._cached[key] = None
            self._cached.move_to_end(key)
            if len(self._cached) > MAX_REMEMBERED:
                self._cached.popitem(last=False)
        self._grant()

    def _grant(self) -> None:
        """Oldest first, passing over waiters of uncached prefixes while one is being filled."""
        index = 0
        while index < len(self._waiting) and self.busy < self.slots:
            key, granted = self._waiting[index][2], self._waiting[index][3]
            if granted.done():  # its waiter was cancelled
                del self._waiting[index]
            elif key not in self._cached and self._filling:
                index += 1
            else:
                del self._waiting[index]
                granted.set_result(None)
                self.busy += 1
                if key not in self._cached:
                    self._filling.add(key)
