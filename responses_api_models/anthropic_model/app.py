"""anthropic_model: the Responses API in front of an upstream that speaks Anthropic's Messages API.

``POST /v1/responses`` is converted to ``POST {anthropic_base_url}/v1/messages`` and the reply
converted back (``polygym.dialects.messages``); ``POST /v1/chat/completions`` goes through the same
path by way of ``polygym.dialects.chat``, and ``POST /v1/messages`` through the base route like
every model server's. The configured model is forced into every call: the policy is chosen by
config, not by whoever calls us.

Choices, and why:
- Anthropic's headers: the key goes in ``x-api-key`` (never a bearer token) with
  ``anthropic-version``; Messages requires ``max_tokens``, so ``max_tokens`` here is used when a
  request has no ``max_output_tokens``.
- The upstream is called the way openai_model calls its own (``ServerClient.request_url``): one
  timeout per call, bounded jittered retries within the caller's budget on connection errors and
  transient statuses — Anthropic's 529 ``overloaded_error`` included — and a bounded reply body.
  A call that fails for good is a 502/504 naming the URL (password masked) with its failure class.
- Upstream errors come back with the upstream status and body unchanged (an Anthropic error
  body), plus the failure header with its class, so callers see what the provider said.
- Streaming is refused with a clear 400 on ``/v1/responses``: rollouts need whole responses. (On
  ``/v1/messages`` the base route streams the whole reply as Anthropic's events.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field
from starlette.responses import Response

from polygym import HTTPError, ModelServer, ServerCallError, UpstreamConfig
from polygym.models import (
    TRANSIENT_STATUSES,
    Probe,
    failure,
    redact_text,
    relay,
    strip_token_fields,
    upstream_failure,
)
from polygym.models import chat as chat_convert
from polygym.models import messages as messages_convert

OVERLOADED = 529
"""Anthropic's "overloaded" status: transient, like a 503."""


class Config(UpstreamConfig):
    anthropic_base_url: str = "https://api.anthropic.com"
    """Without ``/v1`` (as the ``anthropic`` SDK takes it); one ending in ``/v1`` works too."""
    anthropic_api_key: str = ""
    """Sent as ``x-api-key``; empty = no key header (a local gateway)."""
    anthropic_model: str
    anthropic_version: str = "2023-06-01"
    max_tokens: int = Field(default=4096, ge=1)
    """``max_tokens`` of a request that sets no ``max_output_tokens``."""


class AnthropicModel(ModelServer[Config]):
    """Responses (and Chat Completions) in front of a Messages upstream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = self.config.anthropic_base_url.rstrip("/")
        self.url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")
        policy = self.config.retry_policy()
        self.retry = dataclasses.replace(policy, retry_statuses=TRANSIENT_STATUSES | {OVERLOADED})
        self.upstream = self.config.upstream_client(self.client.pool_size)
        self.headers = {
            "accept": "application/json",
            "anthropic-version": self.config.anthropic_version,
        }
        if self.config.anthropic_api_key:
            self.headers["x-api-key"] = self.config.anthropic_api_key

    @property
    def model_name(self) -> str:
        return self.config.anthropic_model

    async def shutdown(self) -> None:
        await self.upstream.close()

    def upstream_probes(self) -> list[Probe]:
        """Anthropic's models route, next to its messages route."""
        return [Probe(self.url.removesuffix("/messages") + "/models", self.headers)]

    async def health(self) -> dict[str, Any]:
        return {
            **await super().health(),
            "upstream": redact_text(self.url),
            "model": self.config.anthropic_model,
        }

    async def responses(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        if body.get("stream"):
            raise HTTPError(
                400, "stream=true is not supported on /v1/responses by anthropic_model", "invalid_request"
            )
        raw = body.get("input", [])
        if not (isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(i, dict) for i in raw))):
            raise HTTPError(400, "input must be a string or a list of item objects", "invalid_request")
        request = messages_convert.responses_request_to_messages(
            {**body, "input": strip_token_fields(raw)}, max_tokens=self.config.max_tokens
        )
        request["model"] = self.config.anthropic_model
        try:
            reply = await self.upstream.request_url(
                "POST",
                self.url,
                request,
                headers=self.headers,
                timeout_s=self.config.timeout_s,
                retry=self.retry,
            )
        except ServerCallError as exc:
            raise upstream_failure(exc, self.url, self.retry) from None
        if reply.status != 200:
            return relay(reply)
        reply.source = self.url
        message = reply.json()
        if not isinstance(message, dict):
            shown = redact_text(self.url)
            raise HTTPError(
                502, f"upstream {shown} did not answer with a message object", "bad_reply", failure.BAD_JSON
            )
        return messages_convert.message_to_response(message, self.config.anthropic_model, request=body)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        if not isinstance(body.get("messages"), list):
            raise HTTPError(400, "messages must be a list of message objects", "invalid_request")
        result = await self.responses(chat_convert.chat_request_to_responses(body))
        if isinstance(result, Response):
            return result
        return chat_convert.response_to_chat_completion(result)
