"""vllm_model: the Responses API in front of any Chat Completions server (vLLM, SGLang, llama.cpp, Ollama).

``POST /v1/responses`` is converted to ``POST {base_url}/chat/completions`` and the reply converted
back (``polygym.dialects.chat``); ``POST /v1/chat/completions`` is passed through. The configured
model is forced into every call: the policy is chosen by config, not by whoever calls us.

Choices, and why:
- **Several upstreams, sticky per rollout** (``routing``): the key is the rollout's session id (the
  agent forwards the environment's session cookie) or, without one, a hash of the conversation's
  opening (instructions and the items up to the first user message — the first item alone is often
  a system prompt shared by every task, which would send all of them to one server). Rendezvous
  hashing spreads keys evenly; an upstream that refuses connections is skipped for a cool-down and
  the call goes to the key's next-ranked upstream at once, without a backoff sleep.
- **Bounded retries, one timeout**: connection errors (refused, or reset mid-reply) fail over as
  above; 408/429/502/503/504 are retried on the same upstream (it is up, only busy) with
  exponential backoff and jitter, or after its ``Retry-After`` (capped), at most ``max_attempts``
  rounds and never more than the caller's budget allows (``polygym.net.budget``); ``timeout_s``
  bounds the whole call, and a call past it comes back as a 504. Other upstream errors come back
  with their status and body. Every failure carries its class in the failure header (``RateLimited``,
  ``ConnectionReset``, ``BadJSON``, ``ResponseTooLarge``, ...), final for polygym callers.
- **Context length is an outcome, not a crash**: a 400 saying the prompt and ``max_tokens`` do not
  fit is first answered by retrying once with ``max_tokens`` shrunk to the room left (when the error
  says how much that is); if the prompt itself does not fit, the reply is a Responses object with
  ``status: "incomplete"`` and ``incomplete_details.reason: "max_output_tokens"`` (plus
  ``detail: "context_length_exceeded"`` and the server's message) so the agent ends the rollout
  cleanly. A generation cut off by the limit (``finish_reason: "length"``) is incomplete the same way.
- **Token ids for training** (``return_token_ids``): the upstream is asked for them with vLLM's
  OpenAI-server extensions (see ``TOKEN_REQUEST_FIELDS``) and the ids and log-probs go on the last
  output item of the call (DESIGN §3). A reply without them is a 502, never a silently untrainable
  rollout. Token fields that agents send back on earlier output are stripped before the upstream
  sees the history; with ``supply_prefix_token_ids`` the last call's ids go instead as
  ``required_prefix_token_ids`` (token-in/token-out multi-turn, ``polygym.training.continuation``),
  and each call's last item says whether its prompt extended them (``prompt_continuation``). An
  upstream that states the ``policy_version`` that generated a reply has it carried to the output
  item (``generation_policy_version``).
- **Streaming is refused** with a clear 400: rollouts need whole responses, and a half-forwarded
  stream could not be retried.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from pydantic import Field, field_validator
from starlette.responses import Response

from polygym import (
    NO_RETRY,
    HTTPError,
    ModelServer,
    ServerCallError,
    UpstreamConfig,
    input_items,
    new_response,
)
from polygym.models import (
    PREFIX_FIELD,
    PROMPT_CONTINUATION_FIELD,
    Probe,
    Reply,
    attach_token_fields,
    budget,
    failure,
    logprob_semantics,
    parent_ids,
    redact_text,
    relay,
    strip_token_fields,
    upstream_failure,
)
from polygym.models import chat as chat_convert
from responses_api_models.vllm_model.routing import UpstreamPool, content_key

logger = logging.getLogger("polygym.vllm_model")

TOKEN_REQUEST_FIELDS: dict[str, Any] = {
    "return_token_ids": True,
    "logprobs": True,
    "top_logprobs": 0,
    "return_tokens_as_token_ids": True,
}
"""What a call asks the upstream for when token ids are captured.

vLLM's OpenAI server (``vllm/entrypoints/openai/protocol.py``, ``ChatCompletionRequest``):
``return_token_ids`` (vLLM >= 0.10.2) adds ``prompt_token_ids`` to the completion and ``token_ids``
to each choice; ``logprobs`` with a non-null ``top_logprobs`` gives one ``logprobs.content`` entry
(with its ``logprob``) per generated token — vLLM builds no logprobs when ``top_logprobs`` is null;
``return_tokens_as_token_ids`` writes each entry's ``token`` as ``"token_id:<id>"``, which is how
generation ids are recovered from servers that lack ``return_token_ids``.
"""

_CONTEXT_ERROR = re.compile(
    r"context[ _](length|window|size)|maximum model length|max_model_len|longer than the model's",
    re.IGNORECASE,
)
_CONTEXT_LIMIT = (
    re.compile(r"maximum context length (?:is |of )?(\d+)", re.IGNORECASE),
    re.compile(r"maximum model length (?:is |of )?(\d+)", re.IGNORECASE),
    re.compile(r"model's context length \((\d+)", re.IGNORECASE),
)
_PROMPT_TOKENS = (
    re.compile(r"(\d+) (?:tokens )?in the messages", re.IGNORECASE),
    re.compile(r"request has (\d+) input tokens", re.IGNORECASE),
    re.compile(r"(\d+) tokens from the input", re.IGNORECASE),
    re.compile(r"prompt \(length (\d+)\)", re.IGNORECASE),
    re.compile(r"input \((\d+) tokens\)", re.IGNORECASE),
)
_CONTEXT_STATUSES = frozenset({400, 413, 422})


class Config(UpstreamConfig):
    """``max_attempts`` counts rounds per call; a failover to another upstream does not use one."""

    base_url: list[str] = Field(min_length=1)
    """One upstream base URL (``http://host:8000/v1``) or several; a comma-separated string works too."""
    api_key: str = ""
    """Sent as a bearer token to every upstream; empty = no Authorization header."""
    model: str
    """The model name the upstreams serve (vLLM's ``--served-model-name``)."""
    down_cooldown_s: float = Field(default=10.0, ge=0)
    """How long an upstream that refused a connection is passed over."""
    return_token_ids: bool = False
    """Capture prompt/generation token ids and log-probs (a request's ``return_token_ids`` overrides)."""
    reasoning_history: chat_convert.ReasoningHistory = "both"
    """How reasoning items of the history go back upstream: ``reasoning_content``, ``reasoning``,
    ``both`` (current vLLM reads ``reasoning``, most other servers and chat templates
    ``reasoning_content``), ``think_tags`` (re-inlined in the content) or ``drop``."""
    reasoning_output: chat_convert.ReasoningOutput = "summary"
    """Where reasoning text goes in output ``reasoning`` items: ``summary`` or ``content``."""
    parse_think_tags: bool = True
    """Split ``<think>...</think>`` out of the content when the server runs no reasoning parser."""
    shrink_max_tokens: bool = True
    """On a context-length error that says how much room is left, retry once with that ``max_tokens``."""
    supply_prefix_token_ids: bool = False
    """Token-in/token-out multi-turn (with token capture on): send the previous turn's exact prompt +
    generation ids as ``required_prefix_token_ids`` (NeMo Gym 0.7's name), so the upstream extends
    them instead of re-rendering the history (``polygym.training.continuation``). The upstream must
    implement that extension (polygym's generation server does; stock vLLM does not: every later
    turn then fails with a 502 rather than drifting silently)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Fields added to every upstream chat request (e.g. ``chat_template_kwargs``, ``top_k``);
    the request's own fields win."""

    @field_validator("base_url", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part for part in re.split(r"[,\s]+", value) if part]
        if isinstance(value, list | tuple):
            urls = [str(url).strip().rstrip("/") for url in value]
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"upstream URL {url!r} must start with http:// or https://")
            return urls
        return value


class TokenCaptureError(Exception):
    """The upstream's reply lacks the token ids or log-probs that were asked for."""


def token_fields(completion: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """``(prompt ids, generation ids, generation log-probs)`` of a chat completion's first choice.

    Reads vLLM's ``prompt_token_ids`` (on the completion; per choice on some servers) and
    ``choices[0].token_ids``; without the latter, the ids are read from ``"token_id:<id>"`` log-prob
    tokens. Raises TokenCaptureError naming whatever is missing or inconsistent.
    """
    choice = (completion.get("choices") or [{}])[0]
    prompt = completion.get("prompt_token_ids")
    if prompt is None:
        prompt = choice.get("prompt_token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    generated = choice.get("token_ids")
    if generated is None and content:
        generated = _ids_from_logprob_tokens(content)
    missing = []
    if prompt is None:
        missing.append("prompt_token_ids")
    if generated is None:
        missing.append("choices[0].token_ids")
    if content is None and generated:
        missing.append("choices[0].logprobs.content")
    if missing:
        raise TokenCaptureError(f"the reply has no {', '.join(missing)}")
    log_probs = [float(entry.get("logprob", float("nan"))) for entry in content or []]
    assert prompt is not None and generated is not None
    if len(log_probs) != len(generated):
        raise TokenCaptureError(
            f"the reply has {len(generated)} generated token ids but {len(log_probs)} log-probs"
        )
    return [int(t) for t in prompt], [int(t) for t in generated], log_probs


def continuation_stamp(
    completion: dict[str, Any], prompt: list[int], prefix: list[int] | None, no_prefix: str | None, url: str
) -> dict[str, Any] | None:
    """The call's ``prompt_continuation``: exact when the upstream's prompt starts with the ids
    supplied, else the upstream's or our own reason; None on a first turn or with supply off.
    Answers 502 when the upstream ignored the prefix without saying so (stock vLLM
    has no ``required_prefix_token_ids``): a silently re-rendered history is what this prevents."""
    if prefix is None:
        return None if no_prefix is None else {"exact": False, "reason": no_prefix}
    stated = completion.get(PROMPT_CONTINUATION_FIELD)
    if isinstance(stated, dict) and stated.get("exact") is False:
        reason = stated.get("reason") or "the upstream rendered the history anew"
        return {"exact": False, "reason": str(reason)}
    if prompt[: len(prefix)] != prefix:
        raise HTTPError(
            502,
            f"upstream {redact_text(url)}: its prompt_token_ids do not start with the {PREFIX_FIELD} "
            "sent, so it lacks that extension: use polygym's generation server or NeMo RL's vLLM "
            "server, or set supply_prefix_token_ids: false",
            "upstream_prefix_ignored",
        )
    return {"exact": True}


def upstream_semantics(completion: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """How the upstream's log-probs were taken: what it says (polygym's generation server says
    ``logprob_semantics``), else vLLM's default: the raw model distribution (``logprobs_mode:
    raw_logprobs``), before the request's temperature and top-p."""
    stated = completion.get("logprob_semantics")
    if isinstance(stated, dict):
        return stated
    return logprob_semantics("vllm", chat.get("temperature"), "raw")


def upstream_policy_version(completion: dict[str, Any]) -> int | None:
    """The policy version the upstream says generated the reply (polygym's generation server states
    ``policy_version``; stock vLLM does not, and the trainer's collector stamps the rollout instead)."""
    version = completion.get("policy_version")
    return version if isinstance(version, int) and not isinstance(version, bool) and version >= 0 else None


def _ids_from_logprob_tokens(content: list[dict[str, Any]]) -> list[int] | None:
    ids = []
    for entry in content:
        token = str(entry.get("token", ""))
        if not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            return None
    return ids


def context_overflow(reply: Reply) -> tuple[str, int | None, int | None] | None:
    """``(message, context limit, prompt tokens)`` when ``reply`` is a context-length error, else None.

    The numbers are read from the message when it states them (vLLM, SGLang) or from llama.cpp's
    ``n_ctx`` / ``n_prompt_tokens`` error fields; None when not stated.
    """
    if reply.status not in _CONTEXT_STATUSES:
        return None
    text = reply.body.decode("utf-8", "replace")
    error: Any = None
    try:
        data = orjson.loads(reply.body)
        error = data.get("error") if isinstance(data, dict) else None
    except orjson.JSONDecodeError:
        pass
    message = str(error.get("message", text)) if isinstance(error, dict) else text
    code = str(error.get("code") or error.get("type") or "") if isinstance(error, dict) else ""
    if not (_CONTEXT_ERROR.search(message) or "context" in code):
        return None
    limit = _first_number(_CONTEXT_LIMIT, message)
    prompt = _first_number(_PROMPT_TOKENS, message)
    if isinstance(error, dict):
        limit = limit if limit is not None else _int_or_none(error.get("n_ctx"))
        prompt = prompt if prompt is not None else _int_or_none(error.get("n_prompt_tokens"))
    return message[:2000], limit, prompt


def _first_number(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        found = pattern.search(text)
        if found:
            return int(found.group(1))
    return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opening(items: list[dict[str, Any]], limit: int = 4) -> list[dict[str, Any]]:
    """The conversation's first items, up to and including its first user message."""
    opening = []
    for item in items[:limit]:
        opening.append(item)
        if item.get("role") == "user":
            break
    return opening


class VLLMModel(ModelServer[Config]):
    """Responses in front of one or more Chat Completions upstreams."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = UpstreamPool(self.config.base_url, self.config.down_cooldown_s)
        self.retry = self.config.retry_policy()
        self.upstream = self.config.upstream_client(self.client.pool_size)
        self.headers = {"accept": "application/json"}
        if self.config.api_key:
            self.headers["authorization"] = f"Bearer {self.config.api_key}"

    @property
    def model_name(self) -> str:
        return self.config.model

    async def shutdown(self) -> None:
        await self.upstream.close()

    def upstream_probes(self) -> list[Probe]:
        """Every upstream's models route (vLLM serves ``/v1/models``), so one dead replica shows."""
        return [Probe(url.rstrip("/") + "/models", self.headers) for url in self.config.base_url]

    async def health(self) -> dict[str, Any]:
        return {**await super().health(), "model": self.config.model, "upstreams": self.pool.status()}

    # -- /v1/responses -----------------------------------------------------------------------
    async def responses(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        _refuse_stream(body)
        raw = body.get("input", [])
        if not (isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(i, dict) for i in raw))):
            raise HTTPError(400, "input must be a string or a list of item objects", "invalid_request")
        history = input_items(body)
        items = strip_token_fields(history)
        flag = body.get("return_token_ids")
        want_tokens = flag if isinstance(flag, bool) else self.config.return_token_ids
        chat = chat_convert.responses_request_to_chat(
            {**body, "input": items}, reasoning=self.config.reasoning_history
        )
        chat = {**self.config.extra_body, **chat, "model": self.config.model}
        prefix, no_prefix = None, None
        if want_tokens:
            _ask_for_tokens(chat)
            if self.config.supply_prefix_token_ids:
                prefix, no_prefix = parent_ids(history)
                if prefix is not None:
                    chat[PREFIX_FIELD] = prefix
        key = self._key() or content_key([body.get("instructions"), _opening(items)])
        reply, url = await self._post("/chat/completions", chat, key)
        overflow = context_overflow(reply)
        if overflow is not None:
            retry_body = self._shrunk(chat, overflow)
            if retry_body is not None:
                reply, url = await self._post("/chat/completions", retry_body, key)
                overflow = context_overflow(reply)
        if overflow is not None:
            return self._overflow_response(body, overflow[0])
        if reply.status != 200:
            return relay(reply)
        completion = _completion(reply, url)
        response = chat_convert.chat_completion_to_response(
            completion,
            self.config.model,
            request=body,
            parse_think=self.config.parse_think_tags,
            reasoning_output=self.config.reasoning_output,
        )
        if want_tokens:
            try:
                fields = token_fields(completion)
                attach_token_fields(
                    response["output"],
                    *fields,
                    upstream_semantics(completion, chat),
                    continuation_stamp(completion, fields[0], prefix, no_prefix, url),
                    upstream_policy_version(completion),
                )
            except TokenCaptureError as exc:
                raise HTTPError(
                    502,
                    f"token-id capture is on but upstream {redact_text(url)}: {exc}. It needs an "
                    "upstream that honours return_token_ids and logprobs (vLLM 0.10.2 or newer); set "
                    "return_token_ids: false to run without token ids",
                    "upstream_token_ids_missing",
                ) from None
        return response

    def _shrunk(
        self, chat: dict[str, Any], overflow: tuple[str, int | None, int | None]
    ) -> dict[str, Any] | None:
        """``chat`` with ``max_tokens`` cut to the room the error reports, if that can help."""
        _, limit, prompt = overflow
        asked = chat.get("max_tokens") or chat.get("max_completion_tokens")
        if not self.config.shrink_max_tokens or limit is None or prompt is None or not asked:
            return None
        room = limit - prompt
        if room < 1 or room >= asked:
            return None
        shrunk = {k: v for k, v in chat.items() if k != "max_completion_tokens"}
        shrunk["max_tokens"] = room
        return shrunk

    def _overflow_response(self, body: dict[str, Any], message: str) -> dict[str, Any]:
        """An incomplete Responses object for a conversation that no longer fits the context."""
        return new_response(
            [],
            self.config.model,
            None,
            status="incomplete",
            incomplete_details={
                "reason": "max_output_tokens",
                "detail": "context_length_exceeded",
                "message": message,
            },
            error=None,
            tools=body.get("tools") or [],
            tool_choice=body.get("tool_choice", "auto"),
            parallel_tool_calls=body.get("parallel_tool_calls", True),
            instructions=body.get("instructions"),
            metadata=body.get("metadata"),
        )

    # -- /v1/chat/completions ------------------------------------------------------------------
    async def chat_completions(self, body: dict[str, Any]) -> Response:
        """Pass-through (routed, model forced, token fields of the history stripped)."""
        _refuse_stream(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise HTTPError(400, "messages must be a list of message objects", "invalid_request")
        messages = strip_token_fields(messages)
        payload = {**self.config.extra_body, **body, "messages": messages, "model": self.config.model}
        if self.config.return_token_ids and body.get("return_token_ids") is not False:
            _ask_for_tokens(payload)
        key = self._key() or content_key([_opening(messages)])
        reply, _ = await self._post("/chat/completions", payload, key)
        return relay(reply)

    # -- upstream calls ------------------------------------------------------------------------
    @staticmethod
    def _key() -> str | None:
        session = ModelServer.session_id()
        return f"session:{session}" if session else None

    async def _post(self, path: str, payload: dict[str, Any], key: str) -> tuple[Reply, str]:
        """POST to the key's upstream, failing over and retrying as the module docstring says."""
        call = budget.current().narrowed(self.retry.attempts, self.config.timeout_s)
        rounds, deadline = call.attempts or 1, call.deadline or 0.0
        with budget.within(budget.CallBudget(deadline=deadline)):
            return await self._post_rounds(path, payload, key, rounds, deadline)

    async def _post_rounds(
        self, path: str, payload: dict[str, Any], key: str, rounds: int, deadline: float
    ) -> tuple[Reply, str]:
        ranking = self.pool.ranking(key)
        failed: set[str] = set()
        errors: list[str] = []
        last_class = failure.CONNECTION_REFUSED
        attempt = 1
        while True:
            url = self.pool.pick(ranking, failed)
            if url is None:  # every upstream refused this round
                if attempt >= rounds or not await budget.pause(self.retry.delay(attempt), deadline):
                    reasons = "; ".join(errors[-len(ranking) :])
                    raise HTTPError(
                        502,
                        f"cannot reach any upstream after {attempt} round(s): {reasons}",
                        "upstream_unreachable",
                        last_class,
                    )
                attempt += 1
                failed.clear()
                continue
            try:
                reply = await self.upstream.request_url(
                    "POST",
                    url + path,
                    payload,
                    headers=self.headers,
                    timeout_s=self.config.timeout_s,
                    retry=NO_RETRY,
                )
            except ServerCallError as exc:
                if exc.error_class in (failure.TIMEOUT, failure.RESPONSE_TOO_LARGE):
                    raise upstream_failure(exc, url + path, self.retry) from None
                logger.warning("upstream %s unreachable (%s); passing it over", redact_text(url), exc.detail)
                self.pool.mark_down(url)
                failed.add(url)
                errors.append(f"{redact_text(url)}: {exc.detail}")
                last_class = exc.error_class
                continue
            self.pool.mark_up(url)
            if not self.retry.should_retry_status(reply.status) or attempt >= rounds:
                return reply, url
            if not await budget.pause(self.retry.delay(attempt, reply.headers.get("retry-after")), deadline):
                return reply, url
            attempt += 1


def _ask_for_tokens(payload: dict[str, Any]) -> None:
    """Add ``TOKEN_REQUEST_FIELDS`` to an upstream body, keeping a caller's own ``top_logprobs``."""
    for key, value in TOKEN_REQUEST_FIELDS.items():
        if key != "top_logprobs" or payload.get(key) is None:
            payload[key] = value


def _refuse_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise HTTPError(
            400, "stream=true is not supported by vllm_model; send stream=false", "invalid_request"
        )


def _completion(reply: Reply, url: str) -> dict[str, Any]:
    try:
        data = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise HTTPError(
            502,
            f"upstream {redact_text(url)} did not answer with a chat completion: {reply.body[:300]!r}",
            "upstream_bad_reply",
            failure.BAD_JSON,
        )
    return data
