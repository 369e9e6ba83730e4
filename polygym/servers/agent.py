"""Base class for agents: the servers that run the model/tool loop for one rollout.

Routes (DESIGN §3): ``POST /run`` takes a dataset row and returns the verified rollout,
``POST /v1/responses`` runs the loop and returns only the Response (for callers that verify
themselves), ``POST /aggregate_metrics`` is answered by the agent's resources server, which knows
its domain metrics.

What every rollout does around the loop lives here, so that agents differ only in the loop: the row
is checked before anything else (a 422 when it cannot be played), a session is seeded for it, the
loop plays in that session (``play``, the one method a subclass must write), the result is verified,
and the session is released in every case, failures included, so a long run leaks no state: also
when the caller disconnects, which cancels the rollout (``polygym.servers.inbound``) so that no
further model or tool call starts. Model calls carry the session cookie, so model servers can route
a rollout's calls stickily.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.routing import Route

from polygym.kinds import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.protocol import complete_response
from polygym.servers.base import BaseServer, HTTPError, ServerConfig, json_endpoint
from polygym.servers.session_release import SessionRelease


class ServerRef(BaseModel):
    """A ``{type, name}`` reference to another server in the stack."""

    type: str
    name: str


class AgentConfig(ServerConfig):
    resources_server: ServerRef
    model_server: ServerRef
    datasets: list[dict[str, Any]] = []
    model_timeout_s: float = 600.0
    """One model call."""
    verify_timeout_s: float = 300.0
    """The ``/verify`` call that ends a rollout."""

    def model_post_init(self, context: Any) -> None:
        if self.resources_server.type != RESOURCES_KIND:
            raise ValueError(f"resources_server must reference a {RESOURCES_KIND} server")
        if self.model_server.type != MODEL_KIND:
            raise ValueError(f"model_server must reference a {MODEL_KIND} server")


def create_params(row: Any) -> dict[str, Any]:
    """The row's ``responses_create_params``; a 422 when the row is not one an agent can play."""
    if not isinstance(row, dict):
        raise HTTPError(422, "the row must be a JSON object", "validation_error")
    params = row.get("responses_create_params")
    if not isinstance(params, dict) or "input" not in params:
        raise HTTPError(
            422, "responses_create_params: must be an object with an 'input' field", "validation_error"
        )
    return params


AgentConfigT = TypeVar("AgentConfigT", bound=AgentConfig)


class Agent(BaseServer[AgentConfigT]):
    """An agent harness; subclasses implement ``play`` (or ``run`` and ``responses`` wholesale)."""

    kind: ClassVar[str] = AGENT_KIND

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = SessionRelease()

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """Play one rollout of ``row`` and return it verified (row + response + reward)."""
        return await self.play_in_session(row, verify=True)

    async def responses(self, params: dict[str, Any]) -> dict[str, Any]:
        """Play the model/tool loop for ``params`` and return the final Response."""
        return await self.play_in_session({"responses_create_params": params}, verify=False)

    async def play(self, params: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """The loop for one rollout in the seeded session ``cookies``; returns its Response."""
        raise NotImplementedError

    async def play_in_session(self, row: dict[str, Any], verify: bool) -> dict[str, Any]:
        """Check ``row``, seed its session, ``play``, verify when asked, and release the session."""
        params = create_params(row)
        cookies = await self.seed_session(row)
        try:
            response = complete_response(await self.play(params, cookies), params)
            if not verify:
                return response
            reply = await self.client.call(
                self.config.resources_server.name,
                "/verify",
                {**row, "response": response},
                cookies=cookies,
                timeout_s=self.config.verify_timeout_s,
            )
            return reply.json_object()
        finally:
            await self.end_session(cookies)

    async def seed_session(self, row: dict[str, Any]) -> dict[str, str]:
        """Start the rollout's session on the resources server; returns its cookies."""
        reply = await self.client.call(self.config.resources_server.name, "/seed_session", row)
        return dict(reply.cookies)

    async def end_session(self, cookies: dict[str, str]) -> None:
        """Release the rollout's session (``/end_session``, or a NeMo Gym server's ``/close_session``)."""
        await self.release(self.client, self.config.resources_server.name, cookies)

    async def call_model(self, request: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """One model turn; the session cookie rides along so model servers can route stickily."""
        reply = await self.client.call(
            self.config.model_server.name,
            "/v1/responses",
            request,
            cookies=cookies,
            timeout_s=self.config.model_timeout_s,
        )
        return reply.json_object()

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
