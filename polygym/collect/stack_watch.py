"""Watching the servers of the stack a run collects from, and stopping only what a death breaks.

Without a watch, a dead environment server turns every remaining rollout of its agent into a
slow failure (each one retried and backed off), the run ends "successfully" and exits 0, and
nothing names the server. ``StackHealth`` knows which servers each agent needs (itself, its
resources server, its model server, and what those reference); when told that a server died it
names it, and from then on the collector does not send that agent's rollouts at all: each is
recorded at once as a failure of class ``ServerDied`` naming the server (``--resume`` after a
restart reruns them), while agents that do not need the dead server go on. The caller exits
non-zero when ``dead`` is not empty.

How deaths are learnt is the caller's business (this layer does not know how servers were
placed): ``watch`` takes one awaitable per server (or group) that completes with
``(name, how it died)`` when it dies — a child process's exit, an inline server's task ending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping

SERVER_DIED = "ServerDied"
"""``error_class`` of a rollout not run (or cut short) because a server it needs died."""


class StackHealth:
    """The servers known dead, and which agents that stops."""

    def __init__(self, needs: Mapping[str, Iterable[str]]) -> None:
        """``needs``: agent -> every server its rollouts go through (the agent included)."""
        self.needs = {agent: set(servers) | {agent} for agent, servers in needs.items()}
        self.dead: dict[str, str] = {}
        """Server name -> how it died (a readable message, with the log tail when there is one)."""

    def server_died(self, name: str, how: str) -> None:
        self.dead.setdefault(name, how)

    def blocker(self, agent: str) -> str | None:
        """The dead server that stops ``agent``'s rollouts, or None while all it needs is alive."""
        down = sorted(self.needs.get(agent, {agent}) & self.dead.keys())
        return down[0] if down else None

    async def watch(self, deaths: Iterable[Awaitable[tuple[str, str]]]) -> None:
        """Record each death as it happens; runs until cancelled or every watched server has died."""
        pending = {asyncio.ensure_future(death) for death in deaths}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    name, how = task.result()
                    self.server_died(name, how)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
