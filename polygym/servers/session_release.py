"""Releasing a rollout's session on a resources server, by the route that server has.

polygym's resources servers release a session at ``POST /end_session``; NeMo Gym's (0.7 and its
main branch) have no such route but ``POST /close_session``, where an empty body with the session
cookie closes what the rollout holds (NeMo Gym's own sandboxed agents close SWE-bench sandboxes
this way). A rollout that fails before ``/verify`` leaves that state behind unless the caller
closes it, so a caller tries ``/end_session`` and, when a server answers 404, closes there and
every later session of that server too. polygym's servers answer both routes.
"""

from __future__ import annotations

import asyncio
import contextlib

from polygym.net import budget
from polygym.net.client import ServerCallError, ServerClient

RELEASE_TIMEOUT_S = 10.0
END_SESSION = "/end_session"
CLOSE_SESSION = "/close_session"


class SessionRelease:
    """Releases sessions for one caller, remembering which servers close at ``/close_session``."""

    def __init__(self) -> None:
        self.closes_at: set[str] = set()
        self._unawaited: set[asyncio.Task[None]] = set()

    async def __call__(self, client: ServerClient, server: str, cookies: dict[str, str]) -> None:
        """Release the session of ``cookies``; best effort, since the rollout's outcome is known.

        Outside the rollout's budget, and shielded from the caller's cancellation: this also runs
        after the caller gave up (its deadline passed, or it disconnected and the rollout was
        cancelled, which can land while the release is under way), and the session must still be
        released. A cancelled caller returns at once; its release goes on in a task of its own.
        """
        task = asyncio.ensure_future(self._release(client, server, cookies))
        self._unawaited.add(task)
        task.add_done_callback(self._unawaited.discard)
        await asyncio.shield(task)

    async def _release(self, client: ServerClient, server: str, cookies: dict[str, str]) -> None:
        with contextlib.suppress(ServerCallError), budget.within(budget.UNLIMITED):
            if server in self.closes_at:
                await self._post(client, server, CLOSE_SESSION, cookies)
                return
            try:
                await self._post(client, server, END_SESSION, cookies)
            except ServerCallError as exc:
                if exc.status != 404:
                    raise
                self.closes_at.add(server)
                await self._post(client, server, CLOSE_SESSION, cookies)

    @staticmethod
    async def _post(client: ServerClient, server: str, path: str, cookies: dict[str, str]) -> None:
        await client.call(server, path, {}, cookies=cookies, timeout_s=RELEASE_TIMEOUT_S)
