"""Watching the servers of the stack a run collects from, and stopping only what a death breaks.

Without a watch, a dead environment server turns every remaining rollout of its agent into a
slow failure (each one retried and backed off), the run ends "successfully" and exits 0, and
nothing names the server. ``StackHealth`` knows which servers each agent needs (itself, its
resources server, its model server, and what those reference); when told that a server died it
names it, and from then on the collector does not send that agent's rollouts at all: each is
recorded at once as a failure of class ``ServerDied`` naming the server (``--resume`` after a
restart reruns them), while agents that do not need the dead server go on. The caller exits
non-zero when ``dead`` is not empty.

A server may also run as replicas (``--workers``, Ray's ``replicas``). The death of one replica
whose server goes on, in its other replicas or restarted, stops no agent: it is kept in
``replica_deaths`` for the caller to name, and the rollouts it cut are failures like any other
(the caller exits non-zero when there were some, so that a lost rollout is never silent).

How deaths are learnt is the caller's business (this layer does not know how servers were
placed): ``watch`` takes streams of ``Death`` — a child process's exit, an inline server's task
ending, each replica death of a replicated backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping

SERVER_DIED = "ServerDied"
"""``error_class`` of a rollout not run (or cut short) because a server it needs died."""

Death = tuple[str, str, tuple[str, ...]]
"""(what died: a server or a worker, how it died, the servers it left with no live replica)."""


class StackHealth:
    """The servers known dead, and which agents that stops."""

    def __init__(self, needs: Mapping[str, Iterable[str]]) -> None:
        """``needs``: agent -> every server its rollouts go through (the agent included)."""
        self.needs = {agent: set(servers) | {agent} for agent, servers in needs.items()}
        self.dead: dict[str, str] = {}
        """Server name -> how it died (a readable message, with the log tail when there is one)."""
        self.replica_deaths: list[tuple[str, str]] = []
        """(what died, how) for each death that left every server serving."""

    def server_died(self, name: str, how: str) -> None:
        self.dead.setdefault(name, how)

    def record(self, death: Death) -> None:
        who, how, down = death
        if not down:
            self.replica_deaths.append((who, how))
        for name in down:
            self.server_died(name, how)

    def blocker(self, agent: str) -> str | None:
        """The dead server that stops ``agent``'s rollouts, or None while all it needs is alive."""
        down = sorted(self.needs.get(agent, {agent}) & self.dead.keys())
        return down[0] if down else None

    async def watch(self, streams: Iterable[AsyncIterator[Death]]) -> None:
        """Record each death as it happens; runs until cancelled or every stream has ended."""
        await asyncio.gather(*(self._follow(stream) for stream in streams))

    async def _follow(self, stream: AsyncIterator[Death]) -> None:
        async for death in stream:
            self.record(death)
