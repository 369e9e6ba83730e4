"""Base class for agents: the servers that run the model/tool loop for one rollout.

Routes (DESIGN §3): ``POST /run`` takes a dataset row and returns the verified rollout,
``POST /v1/responses`` runs the loop and returns only the Response (for callers that verify
themselves), ``POST /aggregate_metrics`` is answered by the agent's resources server, which knows
its domain metrics.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.routing import Route

from polygym.protocol import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.server import BaseServer, ServerConfig, json_endpoint


class ServerRef(BaseModel):
    """A ``{type, name}`` reference to another server in the stack."""

    type: str
    name: str


class AgentConfig(ServerConfig):
    resources_server: ServerRef
    model_server: ServerRef
    datasets: list[dict[str, Any]] = []

    def model_post_init(self, context: Any) -> None:
        if self.resources_server.type != RESOURCES_KIND:
            raise ValueError(f"resources_server must reference a {RESOURCES_KIND} server")
        if self.model_server.type != MODEL_KIND:
            raise ValueError(f"model_server must reference a {MODEL_KIND} server")


class Agent(BaseServer):
    """An agent harness; subclasses implement ``run`` and ``responses``."""

    kind: ClassVar[str] = AGENT_KIND
    Config: ClassVar[type[ServerConfig]] = AgentConfig
    config: AgentConfig

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """Play one rollout of ``row`` and return it verified (row + response + reward)."""
        raise NotImplementedError

    async def responses(self, params: dict[str, Any]) -> dict[str, Any]:
        """Play the model/tool loop for ``params`` and return the final Response."""
        raise NotImplementedError

    def routes(self) -> list[Route]:
        return [
            *super().routes(),
            Route("/run", json_endpoint(self._run), methods=["POST"]),
            Route("/v1/responses", json_endpoint(self._responses), methods=["POST"]),
            Route("/aggregate_metrics", json_endpoint(self._aggregate), methods=["POST"]),
        ]

    async def _run(self, body: Any, request: Request) -> dict[str, Any]:
        return await self.run(body)

    async def _responses(self, body: Any, request: Request) -> dict[str, Any]:
        return await self.responses(body)

    async def _aggregate(self, body: Any, request: Request) -> Any:
        reply = await self.client.call(self.config.resources_server.name, "/aggregate_metrics", body)
        return reply.json()
