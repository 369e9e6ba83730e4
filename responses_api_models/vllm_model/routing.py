"""Choosing an upstream for a model call: sticky per rollout, spread evenly, around dead servers.

Why sticky: every call of one rollout resends the whole conversation so far. Sent to the server
that answered the previous turn, that prefix is already in its KV cache (vLLM and SGLang prefix
caching) and only the new turn is computed; sent anywhere else, the whole prefix is recomputed.

Why rendezvous (highest-random-weight) hashing: each key ranks every upstream by a hash of
(key, url) and takes the best. Keys spread evenly, nothing is stored per key, every replica of
this server agrees without talking to the others, and when an upstream is added or removed only
the keys that ranked it first move. The ranking also gives each key a fixed order of fallbacks.

Why a cool-down instead of health checks: an upstream that refused a connection is skipped by
every call for ``cooldown_s`` (so one dead server costs one failed connect, not one per call), then
tried again by the next call that ranks it first. Calls whose every upstream is cooling down still
try them (best ranked first): a cool-down is a hint, never a reason to fail a call.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import orjson


def _score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{url}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def content_key(parts: list[Any]) -> str:
    """A stable key for a conversation from its opening parts (any JSON data)."""
    raw = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class UpstreamPool:
    """The upstream base URLs, their ranking per key, and which are cooling down after a failure."""

    def __init__(
        self, urls: list[str], cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self.urls = [url.rstrip("/") for url in urls]
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self.calls: dict[str, int] = dict.fromkeys(self.urls, 0)
        self.failures: dict[str, int] = dict.fromkeys(self.urls, 0)

    def ranking(self, key: str) -> list[str]:
        """Every upstream, best first for ``key`` (the same order on every call and process)."""
        if len(self.urls) == 1:
            return list(self.urls)
        return sorted(self.urls, key=lambda url: _score(key, url), reverse=True)

    def is_down(self, url: str) -> bool:
        until = self._down_until.get(url)
        if until is None:
            return False
        if self._clock() >= until:
            del self._down_until[url]
            return False
        return True

    def pick(self, ranking: list[str], exclude: set[str]) -> str | None:
        """The best upstream of ``ranking`` not in ``exclude``, preferring those not cooling down."""
        left = [url for url in ranking if url not in exclude]
        if not left:
            return None
        return next((url for url in left if not self.is_down(url)), left[0])

    def mark_down(self, url: str) -> None:
        self.failures[url] = self.failures.get(url, 0) + 1
        self._down_until[url] = self._clock() + self.cooldown_s

    def mark_up(self, url: str) -> None:
        self.calls[url] = self.calls.get(url, 0) + 1
        self._down_until.pop(url, None)

    def status(self) -> list[dict[str, Any]]:
        """One entry per upstream for the liveness payload."""
        return [
            {"url": url, "down": self.is_down(url), "calls": self.calls[url], "failures": self.failures[url]}
            for url in self.urls
        ]
