"""Start a stack or join a running one, for exactly as long as one command or trainer needs it.

Every caller that collects rollouts (``gym eval run``, ``gym eval run --blend``, ``TokenCollector``)
needs the same three things, and each used to do them its own way:

- servers: started from a ``StackConfig`` in this process, or a running stack found by its head URL;
- one client to reach them, closed exactly once at the end. With the inline backend the stack's own
  in-process client is used (and closed by the stack); with ``--backend subprocess`` or a joined
  stack this session creates a client over HTTP and closes it itself;
- the certainty that every agent the rows are routed to exists, before the first rollout is sent.

``StackSession`` reads the known agents on entry without starting anything when it has a config
(so a typo in a dataset or spec costs a second, not a stack start-up), starts the stack on
``connect()``, and undoes everything on exit, whatever happened in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from polygym.kinds import AGENT_KIND
from polygym.net.client import ServerClient
from polygym.suggest import unknown_name_message

if TYPE_CHECKING:
    from polygym.stack.config import StackConfig
    from polygym.stack.launcher import Stack

MIN_POOL_SIZE = 64


@dataclass(frozen=True)
class StackTarget:
    """Where a session's servers come from: a ``config`` to start, or a running stack's ``head_url``."""

    config: StackConfig | None = None
    head_url: str | None = None
    backend: str = "inline"
    """How a started stack places its servers (``inline``, ``subprocess``, ``ray``); unused when joining."""
    ray_address: str | None = None
    """The Ray cluster to join (``--backend ray``); None: a local one, or ``RAY_ADDRESS``."""
    replicas: dict[str, int] = field(default_factory=dict)
    """``--replicas NAME=N`` overrides (``--backend ray``)."""
    workers: int | None = None
    """``--workers N``: copies of the inline stack, one process each (None: this process only)."""
    record: bool = True
    """Publish a started stack in the stack records, so ``gym env status`` and ``--no-serve`` see it."""

    def __post_init__(self) -> None:
        if (self.config is None) == (self.head_url is None):
            raise ValueError("give exactly one of config (start a stack) or head_url (join a running one)")


class UnknownAgentError(ValueError):
    """Rows are routed to agents the stack does not run; one line per missing agent."""


class StackSession:
    """Async context manager owning a stack (when it starts one) and the client to reach it.

    ``agents`` is known right after entry; ``connect()`` returns the client, starting the stack
    first when the session has a config. ``pool_size`` (the collector's concurrency, at least
    ``MIN_POOL_SIZE``) sizes the HTTP pool of a client this session creates and, for a stack it
    starts, the pools of that stack's servers, so no pool caps the rollout concurrency.
    """

    def __init__(self, target: StackTarget, pool_size: int = MIN_POOL_SIZE) -> None:
        self.target = target
        self.pool_size = max(MIN_POOL_SIZE, pool_size)
        self.agents: list[str] = []
        self.stack: Stack | None = None
        self.client: ServerClient | None = None
        self._own_client = False

    async def __aenter__(self) -> StackSession:
        if self.target.config is not None:
            self.agents = [server.name for server in self.target.config.by_kind(AGENT_KIND)]
            return self
        assert self.target.head_url is not None
        self._use_client(ServerClient(self.target.head_url, pool_size=self.pool_size))
        try:
            servers = await self._client().servers()
        except BaseException:
            await self.close()
            raise
        self.agents = [s["name"] for s in servers if s.get("kind") == AGENT_KIND]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def require_agents(self, needed: Mapping[str, str]) -> None:
        """Raise ``UnknownAgentError`` unless every agent in ``needed`` (``who -> agent``) exists.

        ``who`` names what needs the agent (``environment mcqa``), so the message says where to fix it.
        """
        problems = [
            f"{who}: {unknown_name_message('agent', agent, self.agents)}"
            for who, agent in needed.items()
            if agent not in self.agents
        ]
        if problems:
            raise UnknownAgentError("\n".join(problems))

    async def connect(self) -> ServerClient:
        """The client to the stack, starting the stack first when this session has a config."""
        if self.client is not None:
            return self.client
        assert self.target.config is not None
        # Imported here: the launcher brings every server's code (uvicorn, Starlette, the head), which
        # a collector joining a running stack (``--no-serve``) never needs.
        from polygym.stack.launcher import Stack

        self.stack = Stack(
            self.target.config,
            self.target.backend,
            head_port=0,
            record=self.target.record,
            pool_size=self.pool_size,
            ray_address=self.target.ray_address,
            replicas=self.target.replicas,
            workers=self.target.workers,
        )
        await self.stack.start()
        if self.stack.client is not None:
            self.client = self.stack.client
        else:
            self._use_client(ServerClient(self.stack.head_url, pool_size=self.pool_size))
        return self._client()

    async def close(self) -> None:
        """Close the client this session created, then stop the stack it started (safe to repeat)."""
        client, stack = self.client, self.stack
        self.client = self.stack = None
        try:
            if client is not None and self._own_client:
                await client.close()
        finally:
            self._own_client = False
            if stack is not None:
                await stack.stop()

    def _use_client(self, client: ServerClient) -> None:
        self.client = client
        self._own_client = True

    def _client(self) -> ServerClient:
        assert self.client is not None
        return self.client
