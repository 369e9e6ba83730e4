"""Wire formats shared by every polygym server: OpenAI Responses objects and the verify contract.

The models are deliberately permissive (``extra="allow"``): dataset rows and responses carry fields
polygym does not know about (verifier inputs, provider extensions, training token ids), and
DESIGN §3 requires unknown fields to pass through untouched. Output items stay plain dicts inside
``Response.output`` so that forwarding a response costs no re-validation; typed access goes through
the small helpers below.
"""

from __future__ import annotations

import copy
import secrets
import time
from dataclasses import dataclass
from typing import Any, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from polygym.items import item_text


class OpenModel(BaseModel):
    """Base for wire models: keeps unknown fields so rows round-trip unchanged.

    Dumps leave out fields the input never had (``exclude_unset``), so a verified row carries
    the user's row as written rather than gaining ``"model": null`` and friends.
    """

    model_config = ConfigDict(extra="allow")

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("exclude_unset", True)
        return super().model_dump(**kwargs)

    def model_dump_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("exclude_unset", True)
        return super().model_dump_json(**kwargs)


class ResponsesCreateParams(OpenModel):
    """The body of ``POST /v1/responses`` (OpenAI Responses create parameters)."""

    input: str | list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model: str | None = None
    instructions: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Any = None
    metadata: dict[str, Any] | None = None


class Usage(OpenModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class FunctionCall:
    """A parsed ``function_call`` output item; ``arguments`` is None when the JSON was invalid."""

    name: str
    call_id: str
    raw_arguments: str
    arguments: dict[str, Any] | None


class Response(OpenModel):
    """An OpenAI Responses object; ``output`` items are dicts (message, function_call, ...)."""

    id: str = ""
    object: str = "response"
    created_at: int | float = 0
    model: str = ""
    status: str | None = "completed"
    """NeMo Gym's stored responses carry ``null`` here; a verifier never depends on it."""
    output: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage | None = None

    def output_text(self) -> str:
        """Text of the last assistant message, the model's final answer."""
        return output_text(self.output)

    def function_calls(self) -> list[FunctionCall]:
        return function_calls(self.output)


class VerifyRequest(OpenModel):
    """A finished rollout sent to ``POST /verify``: the dataset row plus the model's response.

    Environments subclass this to declare the row fields their verifier needs; missing ones then
    get a 422 naming the field instead of a KeyError deep inside the verifier.
    """

    responses_create_params: ResponsesCreateParams
    response: Response


class VerifyResponse(VerifyRequest):
    """The verify result: the request echoed back plus ``reward`` and any verifier fields."""

    reward: float

    @classmethod
    def of(cls, request: VerifyRequest, **verdict: Any) -> Self:
        """The request echoed back with this verdict. A request may already carry an earlier
        verdict's fields (a stored rollout sent again by ``gym eval reverify``, NeMo Gym's
        reverify): the new verdict replaces them instead of colliding with them.

        The request's fields go in as validated (its parsed Response, not a dump of it to parse
        again: 46 -> 15 us for a multi-step rollout, every rollout's verify); a subclass that
        declares one of them as another model gets it re-read from the request's dump."""
        given = {name: getattr(request, name) for name in request.model_fields_set}
        try:
            return cls(**{**given, **(request.model_extra or {}), **verdict})
        except ValidationError:
            return cls(**{**request.model_dump(), **verdict})


class SeedSessionRequest(OpenModel):
    """Body of ``POST /seed_session``: the dataset row, so environments can set up per-task state."""


class AggregateMetricsRequest(OpenModel):
    """Body of ``POST /aggregate_metrics``: verified rollouts of one agent.

    polygym's collectors send them as ``rollouts``, NeMo Gym's as ``verify_responses``; either
    key is read so each project's collector gets real metrics from the other's servers. Sending
    both is refused rather than guessing which one the caller meant.
    """

    rollouts: list[dict[str, Any]] = Field(default_factory=list)
    verify_responses: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def one_list(self) -> AggregateMetricsRequest:
        if self.verify_responses is not None and "rollouts" in self.model_fields_set:
            raise ValueError("send the rollouts as either 'rollouts' or 'verify_responses', not both")
        return self

    def all_rollouts(self) -> list[dict[str, Any]]:
        return self.rollouts if self.verify_responses is None else self.verify_responses


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def message_item(text: str, role: str = "assistant") -> dict[str, Any]:
    """An assistant ``message`` output item holding one ``output_text`` part."""
    return {
        "type": "message",
        "id": new_id("msg"),
        "role": role,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(
    name: str, arguments: str | dict[str, Any], call_id: str | None = None
) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id or new_id("call"),
        "name": name,
        "arguments": raw,
        "status": "completed",
    }


def function_call_output_item(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def new_response(
    output: list[dict[str, Any]],
    model: str,
    usage: dict[str, int] | None = None,
    status: str = "completed",
    **extra: Any,
) -> dict[str, Any]:
    """A Responses object as a plain dict, ready to serialize."""
    body: dict[str, Any] = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "usage": usage or {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    }
    body.update(extra)
    return body


ZERO_USAGE_DETAILS = {
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
# Create parameters an OpenAI Response repeats; NeMo Gym's verify request requires them.
ECHOED_PARAMS: dict[str, Any] = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
INCOMPLETE_REASONS = frozenset({"max_output_tokens", "content_filter"})
"""The ``incomplete_details.reason`` values every OpenAI ``Response`` accepts (the openai package
NeMo Gym 0.7 pins and the newest one): reasons of the *model's* own stop. Any other value is a 422
from NeMo Gym's verifiers."""
TERMINATION_REASON = "ng_termination_reason"
"""``metadata`` key of a Response saying why the *agent* ended the rollout early (the key NeMo Gym's
simple_agent writes); a string, as OpenAI's ``metadata`` requires."""
STEP_LIMIT = "max_steps"
"""The termination reason of an agent that ran out of turns."""


def ended_early(reason: str) -> dict[str, Any]:
    """The fields of a Response an agent cut short (``reason``: e.g. ``STEP_LIMIT``): ``status``
    incomplete, the reason in ``metadata``. Not in ``incomplete_details``, whose reasons are the
    model's own (``INCOMPLETE_REASONS``)."""
    return {"status": "incomplete", "metadata": {TERMINATION_REASON: reason}}


def complete_response(response: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``response`` with every field an OpenAI ``Response`` requires, defaults filled in.

    Model servers and agents build responses lean (the fields polygym reads); NeMo Gym's
    verifiers validate the ``response`` of ``/verify`` as a complete OpenAI Response and answer
    422 for a missing ``tools`` or ``usage.input_tokens_details``. This is the one place where
    the gaps are closed, so what an agent sends verifies against either project. Fields already
    present are kept as they are; the echoed create parameters come from ``params`` when given.
    """
    params = params or {}
    done = {**response}
    if "id" not in done:  # ids read the random source (a system call each): made only where missing
        done["id"] = new_id("resp")
    done.setdefault("object", "response")
    if "created_at" not in done:
        done["created_at"] = int(time.time())
    if not isinstance(done.get("model"), str):
        done["model"] = str(params.get("model") or "")
    for field, default in ECHOED_PARAMS.items():
        if done.get(field) is None:
            echoed = params.get(field)
            done[field] = echoed if echoed is not None else copy.deepcopy(default)
    output = done.get("output")
    done["output"] = [complete_item(i) for i in output] if isinstance(output, list) else []
    given_usage = done.get("usage")
    usage: dict[str, Any] = given_usage if isinstance(given_usage, dict) else {}
    done["usage"] = {**usage, **sum_usage([usage]), **complete_usage_details(usage)}
    return _valid_incomplete_details(done)


def _valid_incomplete_details(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` with an ``incomplete_details.reason`` outside ``INCOMPLETE_REASONS`` (an agent's
    own, such as ``max_steps``) moved to ``metadata[TERMINATION_REASON]``, so it still verifies."""
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if reason is None or reason in INCOMPLETE_REASONS:
        return response
    given = response.get("metadata")
    metadata = given if isinstance(given, dict) else {}
    return {**response, "incomplete_details": None, "metadata": {**metadata, TERMINATION_REASON: str(reason)}}


def complete_usage_details(usage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The token detail objects of ``usage``, missing or null counts as 0."""
    details = {}
    for key, zeros in ZERO_USAGE_DETAILS.items():
        raw = usage.get(key)
        given: dict[str, Any] = raw if isinstance(raw, dict) else {}
        details[key] = {**given, **{k: v for k, v in zeros.items() if given.get(k) is None}}
    return details


def complete_item(item: Any) -> Any:
    """An output item with the ids, status and annotations OpenAI's item types require."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "message" and item.get("role", "assistant") == "assistant":
        content = item.get("content")
        parts = content if isinstance(content, list) else [{"type": "output_text", "text": item_text(item)}]
        return {
            "id": item["id"] if "id" in item else new_id("msg"),
            "role": "assistant",
            "status": "completed",
            **item,
            "content": [
                {"annotations": [], **part}
                if isinstance(part, dict) and part.get("type") == "output_text"
                else part
                for part in parts
            ],
        }
    if kind in ("function_call", "function_call_output"):
        fresh = item["id"] if "id" in item else new_id("fc" if kind == "function_call" else "fco")
        return {"id": fresh, "status": "completed", **item}
    return item


def output_text(items: list[dict[str, Any]]) -> str:
    """Concatenated ``output_text`` of the last assistant message in ``items`` ('' if none)."""
    for item in reversed(items):
        if (
            isinstance(item, dict)
            and item.get("type") == "message"
            and item.get("role", "assistant") == "assistant"
        ):
            return item_text(item)
    return ""


def function_calls(items: list[dict[str, Any]]) -> list[FunctionCall]:
    """Every ``function_call`` item in order, with arguments parsed when they are a JSON object."""
    calls = []
    for item in items:
        if item.get("type") != "function_call":
            continue
        raw = item.get("arguments") or ""
        try:
            parsed = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            parsed = None
        calls.append(
            FunctionCall(
                name=str(item.get("name", "")),
                call_id=str(item.get("call_id", "")),
                raw_arguments=raw,
                arguments=parsed if isinstance(parsed, dict) else None,
            )
        )
    return calls


def input_items(params: ResponsesCreateParams | dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a bare string becomes one user message)."""
    raw = params.input if isinstance(params, ResponsesCreateParams) else params.get("input", [])
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return list(raw)


def sum_usage(usages: list[dict[str, Any] | None]) -> dict[str, int]:
    """Add token usage over model calls (one rollout has several)."""
    total = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    for usage in usages:
        for key in total:
            total[key] += int((usage or {}).get(key) or 0)
    return total
