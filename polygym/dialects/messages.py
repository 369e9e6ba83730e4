"""Converting between the OpenAI Responses and Anthropic Messages shapes.

polygym speaks Responses everywhere (DESIGN §3). Two things need Anthropic's Messages API: clients
written for it (Claude-style agent harnesses, the ``anthropic`` SDK) calling any of our model servers
on ``POST /v1/messages``, and policies only reachable through it (``anthropic_model``). This module
is the one place that maps between the two, in both directions, the way ``chat`` does for Chat
Completions (and with its pieces where the concept is the same: reasoning items, echoed fields):

- ingress: ``check_request``, ``messages_request_to_responses``, ``response_to_message``,
  ``message_events`` (the SSE stream of a whole message), ``error_body``;
- egress: ``responses_request_to_messages``, ``message_to_response``.

How the concepts meet:

- ``system`` is ``instructions``. Messages has no system role inside the conversation, so system and
  developer messages of a Responses input join ``system`` (in order) on the way out.
- A Messages turn is a list of content blocks; Responses spreads one turn over items. ``tool_use``
  is a ``function_call`` (``id`` = ``call_id``, ``input`` object = ``arguments`` JSON),
  ``tool_result`` a ``function_call_output``, ``thinking`` a ``reasoning`` item whose
  ``encrypted_content`` carries the block's ``signature`` (Anthropic refuses a thinking block sent
  back without the signature it issued, so a reasoning item without one is not sent to it).
  Consecutive items of one role become one message, tool results first, as Anthropic requires.
- Function arguments that are not a JSON object (model output is untrusted) cannot be a
  ``tool_use.input``; they are kept, not dropped, as ``{"_unparsed_arguments": raw}``.
- ``stop_reason``: ``tool_use`` when the turn calls tools, ``max_tokens`` / ``refusal`` for an
  incomplete response (``max_output_tokens`` / ``content_filter``), else ``end_turn``.
- Usage: Anthropic's ``input_tokens`` excludes cache reads (``cache_read_input_tokens``); OpenAI's
  includes them (``input_tokens_details.cached_tokens``).

Left out rather than approximated: server tools (web search, ...), documents and citations,
``redacted_thinking`` blocks, extended-thinking budgets, Responses-only items. Pure data in, data
out; ``check_request`` is the only validation, because ingress bodies come from anyone.
"""

from __future__ import annotations

from typing import Any

import orjson

from polygym.dialects.chat import (
    content_text,
    converted_response,
    item_type,
    reasoning_item,
    reasoning_text,
)
from polygym.protocol import function_call_item, message_item, new_id

UNPARSED_ARGUMENTS_KEY = "_unparsed_arguments"
"""The ``tool_use.input`` key holding function arguments that were not a JSON object."""

BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
"""Content block types a Messages request may carry here (``redacted_thinking`` is accepted, dropped)."""

# Responses create field -> Messages field, for fields that only change name (or not at all).
_SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}

_STOP_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}
_INCOMPLETE_REASONS = {"max_tokens": "max_output_tokens", "refusal": "content_filter"}

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


# ------------------------------------------------------------------------------------ validation


class MessagesRequestError(ValueError):
    """A Messages request this module cannot map; the message names the field."""


def check_request(body: Any) -> None:
    """Raise MessagesRequestError naming the first field of ``body`` that is not a Messages request.

    Checks what the mapping relies on (types of the fields it reads), not every rule of
    Anthropic's API: a lenient server is more useful than a strict copy of one.
    """
    if not isinstance(body, dict):
        raise MessagesRequestError("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesRequestError("messages: must be a non-empty list of message objects")
    for index, message in enumerate(messages):
        _check_message(message, f"messages.{index}")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _check_blocks(system, "system", ("text",))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise MessagesRequestError(f"max_tokens: must be a positive integer, not {max_tokens!r}")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise MessagesRequestError("stream: must be true or false")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise MessagesRequestError("tools: must be a list of tool objects")
    for index, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise MessagesRequestError(f"tools.{index}: must be an object with a name")
        schema = tool.get("input_schema")
        if schema is not None and not isinstance(schema, dict):
            raise MessagesRequestError(f"tools.{index}.input_schema: must be a JSON schema object")
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and isinstance(choice.get("type"), str)):
        raise MessagesRequestError("tool_choice: must be an object with a type")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise MessagesRequestError(f"{where}: must be a message object")
    if message.get("role") not in ("user", "assistant"):
        raise MessagesRequestError(
            f"{where}.role: must be 'user' or 'assistant', not {message.get('role')!r}"
        )
    content = message.get("content")
    if not isinstance(content, str):
        _check_blocks(content, f"{where}.content", BLOCK_TYPES)


def _check_blocks(blocks: Any, where: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(blocks, list):
        raise MessagesRequestError(f"{where}: must be a string or a list of content blocks")
    for index, block in enumerate(blocks):
        at = f"{where}.{index}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise MessagesRequestError(
                f"{at}.type: {kind!r} is not a supported content block (supported: {', '.join(allowed)})"
            )
        assert isinstance(block, dict)
        if kind == "text" and not isinstance(block.get("text"), str):
            raise MessagesRequestError(f"{at}.text: must be a string")
        if kind == "tool_use" and not (
            isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
        ):
            raise MessagesRequestError(f"{at}: a tool_use block needs a string id and name")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise MessagesRequestError(f"{at}.tool_use_id: must be a string")
        if kind == "image" and not isinstance(block.get("source"), dict):
            raise MessagesRequestError(f"{at}.source: must be an image source object")


# ----------------------------------------------------------------------------------------- pieces


def _image_from_block(block: dict[str, Any]) -> dict[str, Any]:
    """A Messages image block -> a Responses ``input_image`` part (base64 as a data URL)."""
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    else:
        url = str(source.get("url", ""))
    return {"type": "input_image", "image_url": url}


def _image_to_block(part: dict[str, Any]) -> dict[str, Any]:
    """A Responses ``input_image`` part -> a Messages image block (a data URL becomes base64)."""
    url = str(part.get("image_url") or "")
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url.removeprefix("data:").partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _input_json(block_input: Any) -> str:
    """``tool_use.input`` -> Responses ``arguments`` (the raw text back when it was unparsable)."""
    if isinstance(block_input, dict) and set(block_input) == {UNPARSED_ARGUMENTS_KEY}:
        return str(block_input[UNPARSED_ARGUMENTS_KEY])
    return orjson.dumps(block_input if block_input is not None else {}).decode()


def _tool_input(arguments: Any) -> dict[str, Any]:
    """Responses ``arguments`` -> ``tool_use.input`` (an object, whatever the model wrote)."""
    if isinstance(arguments, dict):
        return arguments
    raw = arguments if isinstance(arguments, str) else ""
    try:
        parsed = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {UNPARSED_ARGUMENTS_KEY: raw}


def _thinking_block(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "thinking",
        "thinking": reasoning_text(item),
        "signature": item.get("encrypted_content") or "",
    }


def _reasoning_from_block(block: dict[str, Any], item_id: str | None = None) -> dict[str, Any]:
    item = reasoning_item(str(block.get("thinking", "")), item_id=item_id)
    item["encrypted_content"] = str(block.get("signature", ""))
    return item


def tools_from_messages(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages tools -> Responses function tools; server tools (with a ``type``) are left out."""
    converted = []
    for tool in tools or []:
        if tool.get("type") not in (None, "custom"):
            continue
        flat: dict[str, Any] = {"type": "function", "name": tool["name"]}
        if tool.get("description"):
            flat["description"] = tool["description"]
        flat["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        converted.append(flat)
    return converted


def tools_to_messages(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Responses function tools -> Messages tools; other tool types have no counterpart."""
    converted = []
    for tool in tools or []:
        if tool.get("type", "function") != "function" or not tool.get("name"):
            continue
        out: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            out["description"] = tool["description"]
        out["input_schema"] = tool.get("parameters") or {"type": "object", "properties": {}}
        converted.append(out)
    return converted


def tool_choice_from_messages(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "name": choice.get("name", "")}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")


def tool_choice_to_messages(choice: Any, parallel: bool | None) -> dict[str, Any] | None:
    """Responses ``tool_choice`` (+ ``parallel_tool_calls``) -> Messages ``tool_choice``."""
    converted: dict[str, Any] | None = None
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        converted = {"type": "tool", "name": choice["name"]}
    elif choice in ("required", "none", "auto"):
        converted = {"type": {"required": "any"}.get(choice, choice)}
    if parallel is False:
        converted = converted or {"type": "auto"}
        if converted["type"] != "none":
            converted["disable_parallel_tool_use"] = True
    return converted


def usage_from_messages(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Messages usage -> Responses usage (cache reads and writes count as input tokens)."""
    usage = usage or {}
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    converted: dict[str, Any] = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if usage.get("cache_read_input_tokens") is not None:
        converted["input_tokens_details"] = {"cached_tokens": cached}
    return converted


def usage_to_messages(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Responses usage -> Messages usage."""
    usage = usage or {}
    cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": max(int(usage.get("input_tokens") or 0) - cached, 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


# --------------------------------------------------------------------------------------- ingress


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _message_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Messages turn -> Responses input items, in block order.

    Consecutive text and image blocks make one message item; each tool_use, tool_result and
    thinking block is an item of its own.
    """
    role = message["role"]
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            if all(p["type"] == "input_text" for p in parts):
                content: Any = "".join(p["text"] for p in parts)
            else:
                content = list(parts)
            items.append({"type": "message", "role": role, "content": content})
            parts.clear()

    for block in _blocks(message["content"]):
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "input_text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_from_block(block))
        else:
            flush()
            if kind == "tool_use":
                items.append(
                    {
                        "type": "function_call",
                        "call_id": block["id"],
                        "name": block["name"],
                        "arguments": _input_json(block.get("input")),
                    }
                )
            elif kind == "tool_result":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": block["tool_use_id"],
                        "output": _tool_result_text(block),
                    }
                )
            elif kind == "thinking":
                item = _reasoning_from_block(block)
                del item["id"]  # input items need none
                items.append(item)
    flush()
    return items


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    text = content if isinstance(content, str) else content_text(content)
    return f"Error: {text}" if block.get("is_error") else text  # Responses has no error flag


def messages_request_to_responses(body: dict[str, Any]) -> dict[str, Any]:
    """A checked ``POST /v1/messages`` body -> a ``POST /v1/responses`` body."""
    items: list[dict[str, Any]] = []
    for message in body["messages"]:
        items.extend(_message_items(message))
    params: dict[str, Any] = {"input": items}
    if body.get("model") is not None:
        params["model"] = body["model"]
    system = body.get("system")
    if system:
        params["instructions"] = system if isinstance(system, str) else content_text(system)
    tools = tools_from_messages(body.get("tools"))
    if tools:
        params["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        params["tool_choice"] = tool_choice_from_messages(choice)
        if choice.get("disable_parallel_tool_use"):
            params["parallel_tool_calls"] = False
    if body.get("max_tokens") is not None:
        params["max_output_tokens"] = body["max_tokens"]
    for source, target in _SAMPLING_FIELDS.items():
        if body.get(target) is not None:
            params[source] = body[target]
    if body.get("stop_sequences"):
        params["stop"] = list(body["stop_sequences"])
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata:
        params["metadata"] = metadata  # user_id, and anything a polygym server reads (scripts)
        if metadata.get("user_id") is not None:
            params["user"] = metadata["user_id"]
    return params


def response_to_message(response: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """A Responses object -> a Messages response (``type: "message"``)."""
    content: list[dict[str, Any]] = []
    calls = False
    for item in response.get("output") or []:
        kind = item_type(item)
        if kind == "message" and item.get("role", "assistant") == "assistant":
            text = content_text(item.get("content"))
            if text:
                content.append({"type": "text", "text": text})
        elif kind == "reasoning":
            block = _thinking_block(item)
            if block["thinking"]:
                content.append(block)
        elif kind == "function_call":
            calls = True
            content.append(
                {
                    "type": "tool_use",
                    "id": item.get("call_id") or new_id("toolu"),
                    "name": item.get("name", ""),
                    "input": _tool_input(item.get("arguments")),
                }
            )
    if calls:
        stop_reason = "tool_use"
    elif response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        stop_reason = _STOP_REASONS.get(str(reason), "max_tokens")
    else:
        stop_reason = "end_turn"
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model or str(response.get("model", "")),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_to_messages(response.get("usage")),
    }


def message_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` stream of a whole Messages response, in Anthropic's event order.

    polygym's model servers answer whole turns, so the stream is made from the finished message:
    one delta per block (``text_delta``, ``input_json_delta``, ``thinking_delta`` and
    ``signature_delta``). A client's stream accumulator rebuilds exactly ``message`` from it.
    """
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        for name, data in _block_events(block):
            events.append((name, {"type": name, "index": index, **data}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}]
    elif kind == "tool_use":
        empty = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
    else:  # thinking
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    return [
        ("content_block_start", {"content_block": empty}),
        *(("content_block_delta", {"delta": delta}) for delta in deltas),
        ("content_block_stop", {}),
    ]


def sse_body(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    """Server-sent events, one ``event:`` and one ``data:`` line each."""
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n" for name, data in events
    )


def error_body(status: int, message: str) -> bytes:
    """An Anthropic error body, its type chosen by status."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def is_error_body(data: Any) -> bool:
    """Whether ``data`` already is an Anthropic error body (an upstream's, passed on unchanged)."""
    return isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict)


# ---------------------------------------------------------------------------------------- egress


def _item_blocks(item: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """``(role, blocks)`` of one Responses input item; no blocks when it has no Messages form."""
    kind = item_type(item)
    if kind == "message":
        role = "assistant" if item.get("role") == "assistant" else "user"
        content = item.get("content")
        if isinstance(content, str) or content is None:
            return role, [{"type": "text", "text": content}] if content else []
        blocks = []
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("input_text", "output_text", "text") and part.get("text"):
                blocks.append({"type": "text", "text": str(part["text"])})
            elif part.get("type") == "input_image":
                blocks.append(_image_to_block(part))
        return role, blocks
    if kind == "function_call":
        block = {
            "type": "tool_use",
            "id": item.get("call_id") or new_id("toolu"),
            "name": item.get("name", ""),
            "input": _tool_input(item.get("arguments")),
        }
        return "assistant", [block]
    if kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else content_text(output)
        return "user", [{"type": "tool_result", "tool_use_id": item.get("call_id", ""), "content": text}]
    if kind == "reasoning" and item.get("encrypted_content"):
        return "assistant", [_thinking_block(item)]
    return "user", []


def input_to_messages(input_: str | list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Responses ``input`` -> ``(system texts, Messages messages)``.

    System and developer messages go to the system texts. Items of one role in a row share one
    message; in a user message tool results come first (Anthropic requires it).
    """
    items = [{"role": "user", "content": input_}] if isinstance(input_, str) else input_
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for item in items:
        if item_type(item) == "message" and item.get("role") in ("system", "developer"):
            text = content_text(item.get("content"))
            if text:
                system.append(text)
            continue
        role, blocks = _item_blocks(item)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    return system, messages


def responses_request_to_messages(body: dict[str, Any], *, max_tokens: int) -> dict[str, Any]:
    """A ``POST /v1/responses`` body -> a ``POST /v1/messages`` body.

    ``max_tokens`` is used when the body has no ``max_output_tokens`` (Messages requires one).
    Responses-only fields (``store``, ``include``, ``reasoning``, ...) are not sent on, nor
    ``metadata`` (Anthropic accepts only ``user_id`` there, which comes from ``user``).
    """
    system, messages = input_to_messages(body.get("input", []))
    if body.get("instructions"):
        system.insert(0, str(body["instructions"]))
    request: dict[str, Any] = {
        "messages": messages,
        "max_tokens": body.get("max_output_tokens") or max_tokens,
    }
    if body.get("model") is not None:
        request["model"] = body["model"]
    if system:
        request["system"] = "\n\n".join(system)
    tools = tools_to_messages(body.get("tools"))
    if tools:
        request["tools"] = tools
        choice = tool_choice_to_messages(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            request["tool_choice"] = choice
    for source, target in _SAMPLING_FIELDS.items():
        if body.get(source) is not None:
            request[target] = body[source]
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("user"):
        request["metadata"] = {"user_id": str(body["user"])}
    return request


def message_to_response(
    message: dict[str, Any], model: str | None = None, *, request: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Messages response -> a Responses object, in block order.

    Consecutive text blocks make one message item; a reply with no block still yields one (empty)
    assistant message, as ``chat.chat_completion_to_response`` does. With ``request`` (the
    Responses create body) the request fields a Responses object reports are echoed.
    """
    output: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = str(block.get("text", ""))
            last = output[-1] if output else None
            if last is not None and last["type"] == "message":
                last["content"][0]["text"] += text
            else:
                output.append(message_item(text))
        elif kind == "tool_use":
            output.append(
                function_call_item(
                    str(block.get("name", "")), _input_json(block.get("input")), block.get("id")
                )
            )
        elif kind == "thinking":
            output.append(_reasoning_from_block(block))
    return converted_response(
        output,
        model or str(message.get("model", "")),
        usage_from_messages(message.get("usage")),
        request,
        _INCOMPLETE_REASONS.get(str(message.get("stop_reason"))),
    )
