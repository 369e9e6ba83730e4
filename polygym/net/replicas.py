"""Choosing one replica of a server for each call: sticky for sessions, else least outstanding.

A server may run as several replicas (``replicas: N`` on the Ray backend), all registered under
one name. Two rules pick the replica a call goes to:

* **Sticky by session.** A resources server keeps per-rollout state in the replica that seeded
  it, and names that state with a cookie it sets. Every cookie value a replica sets is
  remembered with that replica, and a later call carrying that value goes back to it. The rule
  needs no knowledge of which cookie is the session one, so it holds for NeMo Gym's servers too.
* **Least outstanding requests** for everything else (agents, model servers, a first
  ``/seed_session``): the replica with the fewest calls in flight from this client, the first
  among equals. Unlike round robin it steers around a replica that answers slowly.

A replica that refused a connection is **passed over** while another one is left: a replica that
died stays in the head's registry until its backend learns of the death (about a second on Ray,
more under load), and meanwhile it refuses at once, so with no calls in flight it is exactly the
one "least outstanding" picks. Unmarked, every call (and every retry of it) went there and failed:
one dead copy of a two-copy stack failed 144 rollouts in two seconds while the other copy served.
A mark holds while the head still lists the replica and until it answers, at most
``REFUSED_HOLD_S`` (a replica that refused once under load gets calls again after that); while
one is held, the head is asked again at most every ``LOOKUP_AGAIN_S`` (at once when every
replica refused), so a replica restarted at a new address is learnt and used.

Affinities are bounded (``MAX_AFFINITIES``, oldest forgotten first): a rollout that never ends its
session must not grow the client without limit; refusal marks are bounded by the replicas listed.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

MAX_AFFINITIES = 200_000
"""Cookie values remembered at most; far above the rollouts in flight of any collector."""
REFUSED_HOLD_S = 30.0
"""How long a replica that refused a connection is passed over while the head still lists it."""
LOOKUP_AGAIN_S = 1.0
"""How often, at most, the head is asked again about a server while one of its replicas is passed over."""


def slot_of(entry: dict[str, Any]) -> str:
    """The registry key of one replica: its name, with ``[i]`` for replicas after the first.

    A name maps to its replicas (the Ray backend runs ``replicas: N`` copies of a server); each
    replica holds a slot of its own, so one replica dying and coming back never touches the others,
    and the first replica's key is the bare name that single-replica stacks always had.
    """
    replica = int(entry.get("replica") or 0)
    return entry["name"] if replica == 0 else f"{entry['name']}[{replica}]"


class Replicas:
    """The replica URLs of each server name, the calls in flight to each, and session affinities."""

    def __init__(self, max_affinities: int = MAX_AFFINITIES) -> None:
        self._urls: dict[str, list[str]] = {}
        self._in_flight: dict[str, int] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._max_affinities = max_affinities
        self._refused: dict[str, float] = {}
        """URL -> when it refused a connection (``time.monotonic``); only URLs still listed."""
        self._listed_at: dict[str, float] = {}
        """Server name -> when its URLs were last set (from the head, or by hand)."""

    def set(self, name: str, urls: list[str]) -> None:
        """``name``'s replicas; the marks of URLs no longer listed are dropped."""
        self._urls[name] = list(urls)
        self._listed_at[name] = time.monotonic()
        if self._refused:
            listed = {url for known in self._urls.values() for url in known}
            self._refused = {url: when for url, when in self._refused.items() if url in listed}

    def refused(self, url: str) -> None:
        """The replica at ``url`` refused a connection: pass it over while another one is left."""
        self._refused[url] = time.monotonic()

    def look_again(self, name: str) -> bool:
        """Whether the head should be asked about ``name`` again: every replica of it refused (it
        may serve again at another address), or one did and the last answer is older than
        ``LOOKUP_AGAIN_S`` (a replica restarted at a new address is learnt that way)."""
        passed = [self._passed_over(url) for url in self._urls.get(name, ())]
        if not any(passed):
            return False
        return all(passed) or time.monotonic() - self._listed_at.get(name, 0.0) > LOOKUP_AGAIN_S

    def _passed_over(self, url: str) -> bool:
        when = self._refused.get(url)
        if when is None:
            return False
        if time.monotonic() - when > REFUSED_HOLD_S:
            del self._refused[url]
            return False
        return True

    def pick(self, name: str, cookies: dict[str, str] | None) -> str:
        """The replica for one call to ``name`` (which must be known: ``ServerClient.resolve``)."""
        urls = self._urls[name]
        for value in (cookies or {}).values():
            url = self._affinity.get(value)
            if url in urls:
                return url
        if len(urls) == 1:
            return urls[0]
        serving = [url for url in urls if not self._passed_over(url)] or urls
        return min(serving, key=lambda url: self._in_flight.get(url, 0))

    @contextlib.contextmanager
    def outstanding(self, url: str) -> Iterator[None]:
        """Count one call to ``url`` as in flight while the block runs."""
        self._in_flight[url] = self._in_flight.get(url, 0) + 1
        try:
            yield
        finally:
            self._in_flight[url] -= 1

    def in_flight(self, url: str) -> int:
        return self._in_flight.get(url, 0)

    def remember(self, url: str, cookies: dict[str, str]) -> None:
        """The replica at ``url`` answered, setting ``cookies``: later calls carrying them go back
        to it, and it is not passed over any more."""
        if self._refused:
            self._refused.pop(url, None)
        for value in cookies.values():
            self._affinity[value] = url
            self._affinity.move_to_end(value)
        while len(self._affinity) > self._max_affinities:
            self._affinity.popitem(last=False)
