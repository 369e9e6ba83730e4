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

Affinities are bounded (``MAX_AFFINITIES``, oldest forgotten first): a rollout that never ends its
session must not grow the client without limit.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator

MAX_AFFINITIES = 200_000
"""Cookie values remembered at most; far above the rollouts in flight of any collector."""


class Replicas:
    """The replica URLs of each server name, the calls in flight to each, and session affinities."""

    def __init__(self, max_affinities: int = MAX_AFFINITIES) -> None:
        self._urls: dict[str, list[str]] = {}
        self._in_flight: dict[str, int] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._max_affinities = max_affinities

    def set(self, name: str, urls: list[str]) -> None:
        self._urls[name] = list(urls)

    def forget(self, name: str) -> None:
        """Drop ``name``'s replicas (one refused a connection: ask the head again)."""
        self._urls.pop(name, None)

    def pick(self, name: str, cookies: dict[str, str] | None) -> str:
        """The replica for one call to ``name`` (which must be known: ``ServerClient.resolve``)."""
        urls = self._urls[name]
        for value in (cookies or {}).values():
            url = self._affinity.get(value)
            if url in urls:
                return url
        if len(urls) == 1:
            return urls[0]
        return min(urls, key=lambda url: self._in_flight.get(url, 0))

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
        """The replica at ``url`` set ``cookies``: later calls carrying them go back to it."""
        for value in cookies.values():
            self._affinity[value] = url
            self._affinity.move_to_end(value)
        while len(self._affinity) > self._max_affinities:
            self._affinity.popitem(last=False)
