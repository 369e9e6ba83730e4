"""Base class for model servers: one OpenAI-style interface in front of any policy.

Bodies stay plain dicts: a model server mostly forwards or converts payloads, and validating a
long conversation at every hop would cost more than the rest of the hop.

Every model server also answers Anthropic's ``POST /v1/messages``, with no code of its own: the
request is checked and converted to a Responses request (``polygym.dialects.messages``), served by
the server's ``responses``, and the Response converted back — as one JSON message, or as
Anthropic's server-sent events when the client asks for ``stream``. Its errors, whatever raised
them, come back in Anthropic's error shape so Anthropic clients read them.

A model server that forwards to an upstream API names the URLs to probe (``upstream_probes``); its
``GET /`` asks each one (``GET {base_url}/models``, once, no retry) and says what it found, the URL's
password masked. ``gym env start`` asks every model server as soon as the stack is up, for its
``ready:`` line, ``gym eval run`` before its first rollout (a warning), and ``gym env status``
again, so none calls a policy nobody can reach ``ok``. The probe is not sent from the server's
own start-up: an upstream that a trainer or a test scripts call by call would receive a request
nobody asked for. Servers with nothing upstream (scripted, local) probe nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import orjson
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym.dialects import messages as messages_dialect
from polygym.kinds import MODEL_KIND, UPSTREAM_PROBE, UPSTREAM_PROBE_TIMEOUT_S
from polygym.net import budget, failure
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES
from polygym.net.client import Reply, ServerCallError, ServerClient, error_detail
from polygym.net.retry import NO_RETRY, RetryPolicy
from polygym.protocol import complete_response
from polygym.redact import redact_text
from polygym.servers.base import BaseServer, HTTPError, ServerConfig, json_endpoint, json_response
from polygym.servers.sessions import SESSION_COOKIE

_session_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("polygym_session", default=None)


class UpstreamConfig(ServerConfig):
    """Settings of a model server that forwards to upstream HTTP APIs (openai_model, vllm_model).

    Every upstream call has a timeout and bounded, jittered retries within the caller's budget;
    the pool follows the stack's concurrency unless set, so no hidden limit sits below the
    collector's; every reply body is bounded (``max_response_bytes``, inflated size).
    """

    timeout_s: float = Field(default=600.0, gt=0)
    pool_size: int | None = Field(default=None, ge=0)
    """Connections to the upstreams; unset: the stack's pool (its concurrency, or no limit); 0: no limit."""
    max_response_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1)
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

    def upstream_client(self, stack_pool_size: int) -> ServerClient:
        """The upstream client; ``stack_pool_size`` is the pool of the server's stack client."""
        return ServerClient(
            pool_size=stack_pool_size if self.pool_size is None else self.pool_size,
            timeout_s=self.timeout_s,
            max_body_bytes=self.max_response_bytes,
        )


def upstream_failure(exc: ServerCallError, url: str, policy: RetryPolicy) -> HTTPError:
    """The answer to a call whose upstream failed for good, with its class (final for callers)."""
    shown = redact_text(url)
    if exc.error_class == failure.TIMEOUT:
        message = f"upstream model API {shown} did not answer: {exc.detail}"
        return HTTPError(504, message, "upstream_timeout", failure.TIMEOUT)
    if exc.error_class == failure.RESPONSE_TOO_LARGE:
        return HTTPError(
            502, f"upstream model API {shown}: {exc.detail}", "upstream_response_too_large", exc.error_class
        )
    attempts = min(policy.attempts, budget.current().attempts or policy.attempts)
    return HTTPError(
        502,
        f"cannot reach upstream model API {shown} after {attempts} attempt(s): {exc.detail}",
        "upstream_unreachable",
        exc.error_class,
    )


@dataclass(frozen=True)
class Probe:
    """One upstream route to ask at start and on ``GET /``: its URL and the headers it needs."""

    url: str
    headers: dict[str, str]


async def probe_upstream(client: ServerClient, probe: Probe) -> dict[str, Any]:
    """Ask one upstream route once; what it found, safe to show (the URL's password masked).

    ``reachable`` is false when no HTTP answer came (refused, reset, timed out, no such host);
    ``ok`` also needs the answer not to be a refusal of the key (401, 403) or a server error. A
    404 or 405 is ``ok``: the upstream answers, it just serves no models list.
    """
    shown = redact_text(probe.url)
    try:
        reply = await client.request_url(
            "GET", probe.url, headers=probe.headers, timeout_s=UPSTREAM_PROBE_TIMEOUT_S, retry=NO_RETRY
        )
    except ServerCallError as exc:
        return {"url": shown, "reachable": False, "ok": False, "error": f"unreachable ({exc.error_class})"}
    except Exception as exc:  # a probe says what went wrong; it never fails GET /
        return {"url": shown, "reachable": False, "ok": False, "error": f"not asked ({type(exc).__name__})"}
    ok = reply.status < 400 or reply.status in (404, 405)
    found = {"url": shown, "reachable": True, "ok": ok, "status": reply.status}
    return found if ok else {**found, "error": f"HTTP {reply.status}"}


def relay(reply: Reply) -> Response:
    """An upstream reply passed on unchanged; an error status is marked final with its class."""
    headers = None
    if reply.status >= 400:
        headers = failure.failure_headers(failure.upstream_status_class(reply.status))
    return Response(reply.body, status_code=reply.status, media_type="application/json", headers=headers)


ModelConfigT = TypeVar("ModelConfigT", bound=ServerConfig)


class ModelServer(BaseServer[ModelConfigT]):
    """Subclasses implement ``responses`` and ``chat_completions`` (dict in, dict or Response out);
    ``/v1/messages`` is served through ``responses``."""

    kind: ClassVar[str] = MODEL_KIND

    @property
    def model_name(self) -> str:
        return str(getattr(self.config, "model", None) or self.name)

    def upstream_probes(self) -> list[Probe]:
        """The upstream routes to probe (none by default: a model with nothing upstream)."""
        return []

    async def probe_upstreams(self) -> list[dict[str, Any]] | None:
        """What each upstream probe found; None when the server has nothing upstream."""
        probes = self.upstream_probes()
        if not probes:
            return None
        return list(await asyncio.gather(*(probe_upstream(self.client, p) for p in probes)))

    async def health(self) -> dict[str, Any]:
        found = await self.probe_upstreams()
        return {**await super().health(), **({UPSTREAM_PROBE: found} if found is not None else {})}

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
            Route("/v1/messages", anthropic_errors(json_endpoint(self._messages)), methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]

    async def _responses(self, body: Any, request: Request) -> Any:
        """A reply object is completed to a full OpenAI Response: NeMo Gym's agents validate what
        a model server answers as one (a lean reply is a 500 "invalid response" there)."""
        _session_id.set(request.cookies.get(SESSION_COOKIE))
        params = _require_object(body)
        result = await self.responses(params)
        return complete_response(result, params) if isinstance(result, dict) else result

    async def _chat(self, body: Any, request: Request) -> Any:
        _session_id.set(request.cookies.get(SESSION_COOKIE))
        return await self.chat_completions(_require_object(body))

    async def _messages(self, body: Any, request: Request) -> Any:
        """Anthropic Messages through ``responses`` (see the module docstring)."""
        _session_id.set(request.cookies.get(SESSION_COOKIE))
        try:
            messages_dialect.check_request(body)
        except messages_dialect.MessagesRequestError as exc:
            raise HTTPError(400, str(exc), "invalid_request") from None
        result = await self.responses(messages_dialect.messages_request_to_responses(body))
        if isinstance(result, Response):
            if result.status_code >= 400:
                return result
            result = _reply_object(result)
        message = messages_dialect.response_to_message(result)
        if body.get("stream"):
            events = messages_dialect.message_events(message)
            return Response(
                messages_dialect.sse_body(events),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        return message

    async def _models(self, request: Request) -> Response:
        return json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "polygym"}]}
        )


def _reply_object(response: Response) -> dict[str, Any]:
    """The Responses object in a successful ``Response`` a server's ``responses`` returned."""
    try:
        data = orjson.loads(bytes(response.body))
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise HTTPError(502, "the model's reply is not a Responses object", "bad_reply", failure.BAD_JSON)
    return data


def anthropic_errors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``endpoint`` with every error answer in Anthropic's shape (status and failure class kept).

    One place for all of them: a bad body, an ``HTTPError``, a failed call, a crash, or an upstream
    error relayed by ``responses``. An upstream's own Anthropic error body passes unchanged.
    (A route wrapped so is served through Starlette for in-process callers too: agents use
    ``/v1/responses``, not this.) The inbound guard's 413 comes before routing and keeps
    polygym's shape.
    """

    async def answer(request: Request) -> Response:
        response = await endpoint(request)
        if response.status_code < 400:
            return response
        raw = bytes(response.body)
        try:
            if messages_dialect.is_error_body(orjson.loads(raw)):
                return response
        except orjson.JSONDecodeError:
            pass
        error_class = failure.failure_class(response.headers)
        return Response(
            messages_dialect.error_body(response.status_code, error_detail(raw)),
            status_code=response.status_code,
            media_type="application/json",
            headers=failure.failure_headers(error_class) if error_class else None,
        )

    return answer


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HTTPError(400, "request body must be a JSON object", "invalid_request")
    return body
