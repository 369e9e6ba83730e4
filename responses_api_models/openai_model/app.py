"""openai_model: forwards to any OpenAI-compatible API (OpenAI, Azure-style gateways, vLLM, ...).

``POST /v1/responses`` goes to ``{openai_base_url}/responses`` and ``POST /v1/chat/completions`` to
``{openai_base_url}/chat/completions``, with the configured key as a bearer token and the configured
model forced into the body (the policy is chosen by config, not by whoever calls us).

Choices, and why:
- The reply body is passed through as bytes, never re-parsed: responses can be large and this hop
  sits on every model call of every rollout.
- Upstream errors come back with the upstream status and body unchanged, so callers see exactly what
  the provider said (rate limits, context-length errors), plus the failure header with its class
  (``RateLimited``, ``Upstream5xx``, ...) that tells polygym callers not to retry it again.
- Every call has a timeout (``timeout_s``) and bounded retries with backoff on connection errors and
  transient statuses (429, 502, 503, 504, 408), honouring ``Retry-After`` (capped) and the
  caller's budget; a 500 or 4xx is answered at once. When the upstream cannot be reached the
  caller gets a 502 naming the URL (password masked) and the class; on a timeout, a 504; a reply
  over ``max_response_bytes`` is a 502 ``ResponseTooLarge``.
- Upstream calls use their own connection pool (closed at shutdown); unless ``pool_size`` is set it
  is as large as the stack's, so it never caps the collector's concurrency.
- Its ``GET /`` asks ``{openai_base_url}/models`` once (no retry) and says when the upstream
  cannot be reached (``gym env start``'s ``ready:`` line, ``gym env status``).
- Streaming is refused with a clear 400: rollouts need whole responses, and a half-forwarded stream
  could not be retried.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from polygym import HTTPError, ModelServer, ServerCallError, UpstreamConfig
from polygym.models import Probe, redact_text, relay, upstream_failure


class Config(UpstreamConfig):
    openai_base_url: str
    openai_api_key: str = ""
    openai_model: str


class OpenAIModel(ModelServer[Config]):
    """A proxy to an OpenAI-compatible endpoint."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base_url = self.config.openai_base_url.rstrip("/")
        self.retry = self.config.retry_policy()
        self.upstream = self.config.upstream_client(self.client.pool_size)

    @property
    def model_name(self) -> str:
        return self.config.openai_model

    async def shutdown(self) -> None:
        await self.upstream.close()

    def upstream_probes(self) -> list[Probe]:
        """The models route: every OpenAI-compatible API serves it, and asking it costs nothing."""
        return [Probe(self.base_url + "/models", self._headers())]

    async def health(self) -> dict[str, Any]:
        return {
            **await super().health(),
            "upstream": redact_text(self.base_url),
            "model": self.config.openai_model,
        }

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if self.config.openai_api_key:
            headers["authorization"] = f"Bearer {self.config.openai_api_key}"
        return headers

    async def responses(self, body: dict[str, Any]) -> Response:
        return await self.forward("/responses", body)

    async def chat_completions(self, body: dict[str, Any]) -> Response:
        return await self.forward("/chat/completions", body)

    async def forward(self, path: str, body: dict[str, Any]) -> Response:
        """Send ``body`` (with the configured model) to the upstream ``path``; relay its reply."""
        if body.get("stream"):
            raise HTTPError(
                400, "stream=true is not supported by openai_model; send stream=false", "invalid_request"
            )
        url = self.base_url + path
        headers = self._headers()
        payload = {**body, "model": self.config.openai_model}
        try:
            reply = await self.upstream.request_url(
                "POST", url, payload, headers=headers, timeout_s=self.config.timeout_s, retry=self.retry
            )
        except ServerCallError as exc:
            raise upstream_failure(exc, url, self.retry) from None
        return relay(reply)
