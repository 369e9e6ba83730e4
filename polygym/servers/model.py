"""Base class for model servers: one OpenAI-style interface in front of any policy.

Bodies stay plain dicts: a model server mostly forwards or converts payloads, and validating a
long conversation at every hop would cost more than the rest of the hop.
"""

from __future__ import annotations

import contextvars
from typing import Any, ClassVar, TypeVar

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym.net.client import ServerClient
from polygym.net.retry import RetryPolicy
from polygym.protocol import MODEL_KIND
from polygym.servers.base import BaseServer, HTTPError, ServerConfig, json_endpoint, json_response
from polygym.servers.sessions import SESSION_COOKIE

_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("polygym_session", default=None)


class UpstreamConfig(ServerConfig):
    """Settings of a model server that forwards to upstream HTTP APIs (openai_model, vllm_model).

    Every upstream call has a timeout and bounded, jittered retries; the pool is sized so no
    hidden limit sits below the collector's concurrency.
    """

    timeout_s: float = Field(default=600.0, gt=0)
    pool_size: int = Field(default=1024, ge=1)
    max_attempts: int = Field(default=4, ge=1)
    """Attempts per call, the first included (so 3 retries by default)."""
    retry_base_delay_s: float = Field(default=0.5, ge=0)
    retry_max_delay_s: float = Field(default=8.0, ge=0)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.max_attempts,
            base_delay_s=self.retry_base_delay_s,
            max_delay_s=self.retry_max_delay_s,
        )

    def upstream_client(self) -> ServerClient:
        return ServerClient(pool_size=self.pool_size, timeout_s=self.timeout_s)


ModelConfigT = TypeVar("ModelConfigT", bound=ServerConfig)


class ModelServer(BaseServer[ModelConfigT]):
    """Subclasses implement ``responses`` and ``chat_completions`` (dict in, dict or Response out)."""

    kind: ClassVar[str] = MODEL_KIND

    @property
    def model_name(self) -> str:
        return str(getattr(self.config, "model", None) or self.name)

    @staticmethod
    def session_id() -> str | None:
        """The rollout's session id during a request, when the agent forwarded its cookie.

        Agents send the resources server's session cookie along with model calls, so a model
        server can keep every call of one rollout on the same upstream (prefix-cache reuse).
        """
        return _session_id.get()

    async def responses(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/responses", "not_supported")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        raise HTTPError(404, f"{type(self).__name__} does not serve /v1/chat/completions", "not_supported")

    def routes(self) -> list[Route]:
        return [
            *super().routes(),
            Route("/v1/responses", json_endpoint(self._responses), methods=["POST"]),
            Route("/v1/chat/completions", json_endpoint(self._chat), methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]

    async def _responses(self, body: Any, request: Request) -> Any:
        _session_id.set(request.cookies.get(SESSION_COOKIE))
        return await self.responses(_require_object(body))

    async def _chat(self, body: Any, request: Request) -> Any:
        _session_id.set(request.cookies.get(SESSION_COOKIE))
        return await self.chat_completions(_require_object(body))

    async def _models(self, request: Request) -> Response:
        return json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "polygym"}]}
        )


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HTTPError(400, "request body must be a JSON object", "invalid_request")
    return body
