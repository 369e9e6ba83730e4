"""Per-rollout state for resources servers, keyed by a session id carried in a cookie.

Why a cookie: agents written for NeMo Gym forward the cookies they receive from
``/seed_session`` on every later call, so keying state by a cookie keeps them working unchanged.
Why explicit release plus an idle time-out: a long training run seeds millions of sessions; state
that is never freed grows without bound. A session ends when its rollout is verified, because
NeMo Gym's agents never call ``POST /end_session``; polygym's agents still call it afterwards (and
for rollouts that fail before verify), so ending a session just released at verify answers as a
success. A sweeper drops sessions abandoned by crashed agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

SESSION_COOKIE = "polygym_session"
REMEMBERED_RELEASES = 4096
"""Released ids kept so a late ``/end_session`` succeeds; bounded, ids are 32 bytes each."""


@dataclass
class Session:
    """One rollout's state; ``state`` is free-form for the environment to fill."""

    id: str
    state: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)


class SessionStore:
    """Sessions of one server process, with release and idle expiry."""

    def __init__(self, idle_timeout_s: float = 900.0) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, Session] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._recently_released: OrderedDict[str, None] = OrderedDict()
        self.released = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self) -> Session:
        session = Session(id=secrets.token_hex(16))
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()
        return session

    def release(self, session_id: str) -> bool:
        """Drop a session; returns False if it was unknown (already released or expired)."""
        if self._sessions.pop(session_id, None) is None:
            return False
        self.released += 1
        self._recently_released[session_id] = None
        if len(self._recently_released) > REMEMBERED_RELEASES:
            self._recently_released.popitem(last=False)
        return True

    def end(self, session_id: str) -> bool:
        """Release for a caller ending its rollout: also True when the session was already released.

        Idempotent so that ``/end_session`` after ``/verify`` (which released the session) is no
        error; an id that expired or never existed still answers False.
        """
        return self.release(session_id) or session_id in self._recently_released

    def expire_idle(self, now: float | None = None) -> int:
        """Drop sessions idle for longer than the time-out; returns how many were dropped."""
        now = time.monotonic() if now is None else now
        stale = [sid for sid, s in self._sessions.items() if now - s.last_used > self.idle_timeout_s]
        for sid in stale:
            del self._sessions[sid]
        self.expired += len(stale)
        return len(stale)

    def start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _sweep_forever(self) -> None:
        interval = max(0.05, min(self.idle_timeout_s / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            self.expire_idle()

    def stats(self) -> dict[str, int]:
        return {"active": len(self._sessions), "released": self.released, "expired": self.expired}
