"""Converting between the OpenAI Responses and Chat Completions shapes.

polygym speaks Responses everywhere (DESIGN §3), but many policies are only reachable through Chat
Completions (vLLM, SGLang, llama.cpp, Ollama, most local servers), and some callers only speak Chat
Completions. This module is the one place that maps between the two, in both directions:

- requests: ``responses_request_to_chat`` / ``chat_request_to_responses``
- replies: ``chat_completion_to_response`` / ``response_to_chat_completion``
- pieces: messages <-> input items, reasoning, tools, tool choice, usage, training token fields.

Scope, on purpose: messages of the roles system/developer/user/assistant with text (and image)
content, function calls and their outputs, reasoning, function tools, the common sampling fields
(plus the extra sampling fields open-weight servers accept, such as ``top_k``) and token usage.
Shapes with no counterpart on the other side (built-in tools such as web search, other
Responses-only item types) are left out rather than approximated. Everything here is pure data in,
data out: no I/O, no validation beyond what the mapping needs.

Reasoning, the part that differs most between servers:

- A chat reply carries it in a ``reasoning_content`` field (DeepSeek, SGLang, llama.cpp, older vLLM),
  a ``reasoning`` field (current vLLM), or — when the server runs no reasoning parser — inline as
  ``<think>...</think>`` at the start of ``content``. Chat templates that open the block in the
  prompt make the reply start inside it, so a lone ``</think>`` also ends a reasoning block, and an
  unclosed ``<think>`` (a generation cut off by the token limit) is reasoning up to the end.
- It becomes a Responses ``reasoning`` item placed before the turn's message and calls, with the
  text in ``summary`` (``summary_text``, what NeMo Gym rollouts carry) or in ``content``
  (``reasoning_text``, OpenAI's shape for raw chain of thought) — ``reasoning_output`` chooses.
- Sent back in a history, a reasoning item is attached to the assistant message of its turn as
  ``reasoning_content``, ``reasoning``, both, re-inlined as ``<think>`` tags, or dropped
  (``reasoning`` argument of ``input_to_messages``): servers disagree on which field they read.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import orjson

from polygym.protocol import function_call_item, message_item, new_id, new_response

MESSAGE_ROLES = ("system", "developer", "user", "assistant")

ReasoningHistory = Literal["reasoning_content", "reasoning", "both", "think_tags", "drop"]
"""How reasoning items of a Responses history are sent back in Chat messages."""
ReasoningOutput = Literal["summary", "content"]
"""Where reasoning text goes in a Responses ``reasoning`` item."""

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Responses create field -> Chat Completions field, for fields that only change name (or not at all).
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_output_tokens": "max_tokens",
    "parallel_tool_calls": "parallel_tool_calls",
    "metadata": "metadata",
    "user": "user",
    "seed": "seed",
    "stop": "stop",
    # not in the OpenAI Responses API, but accepted by vLLM / SGLang / llama.cpp and commonly put in
    # dataset rows for RL sampling; carried across unchanged in both directions
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "chat_template_kwargs": "chat_template_kwargs",
}


# -------------------------------------------------------------------------------------- content


def content_text(content: Any) -> str:
    """Plain text of a message content in either API (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _content_to_chat(content: Any) -> str | list[dict[str, Any]]:
    """Responses content -> Chat content: a string when it is all text, else a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type", "")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id", "")
            image: dict[str, Any] = {"url": url}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _content_from_chat(content: Any) -> str | list[dict[str, Any]]:
    """Chat content -> Responses input content: a string when it is all text, else input parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type", "")
        if kind == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url", "") if isinstance(image, dict) else str(image)
            converted: dict[str, Any] = {"type": "input_image", "image_url": url}
            if isinstance(image, dict) and image.get("detail"):
                converted["detail"] = image["detail"]
            parts.append(converted)
    if all(p["type"] == "input_text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


# ------------------------------------------------------------------------------------- reasoning


def split_think(text: str) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a reply that may hold ``<think>...</think>``; reasoning None if none.

    Handles the three shapes models produce: a full ``<think>..</think>`` block, a reply that starts
    inside the block because the chat template opened it in the prompt (only ``</think>``), and an
    unclosed ``<think>`` cut off by the token limit (all of the rest is reasoning).
    """
    start = text.find(THINK_OPEN)
    end = text.find(THINK_CLOSE)
    if end != -1 and (start == -1 or start > end):
        return text[:end].strip(), text[end + len(THINK_CLOSE) :].lstrip()
    if start == -1:
        return None, text
    before = text[:start]
    if end == -1:
        return text[start + len(THINK_OPEN) :].strip(), before.strip()
    return text[start + len(THINK_OPEN) : end].strip(), (before + text[end + len(THINK_CLOSE) :]).lstrip()


def reasoning_item(
    text: str, where: ReasoningOutput = "summary", item_id: str | None = None
) -> dict[str, Any]:
    """A Responses ``reasoning`` item holding ``text`` in its summary or its content."""
    item: dict[str, Any] = {"type": "reasoning", "id": item_id or new_id("rs")}
    if where == "content":
        item["summary"] = []
        item["content"] = [{"type": "reasoning_text", "text": text}]
    else:
        item["summary"] = [{"type": "summary_text", "text": text}]
    return item


def reasoning_text(item: dict[str, Any]) -> str:
    """The text of a ``reasoning`` item: its raw ``content`` when present, else its ``summary``."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("text")]
            if texts:
                return "\n\n".join(texts)
    return ""


def message_reasoning(message: dict[str, Any]) -> str:
    """Reasoning text carried in a Chat message's ``reasoning_content`` or ``reasoning`` field."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _attach_reasoning(message: dict[str, Any], text: str, mode: ReasoningHistory) -> None:
    if mode in ("reasoning_content", "both"):
        message["reasoning_content"] = text
    if mode in ("reasoning", "both"):
        message["reasoning"] = text
    if mode == "think_tags":
        block = f"{THINK_OPEN}\n{text}\n{THINK_CLOSE}\n\n"
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [{"type": "text", "text": block}, *content]
        else:
            message["content"] = block + (content or "")


# ---------------------------------------------------------------------------------- conversation


def item_type(item: dict[str, Any]) -> str:
    """The item's type; a bare ``{"role", "content"}`` input item is a message."""
    return str(item.get("type") or ("message" if "role" in item else ""))


def input_to_messages(
    input_: str | list[dict[str, Any]],
    instructions: str | None = None,
    *,
    reasoning: ReasoningHistory = "reasoning_content",
) -> list[dict[str, Any]]:
    """Responses ``input`` (+ ``instructions``) -> Chat ``messages``.

    Consecutive function calls (and an assistant message just before them) become one assistant
    message with ``tool_calls``, which is how Chat Completions represents one model turn. A
    ``reasoning`` item opens a turn: its text joins the turn's assistant message as ``reasoning``
    says (an assistant message with empty content carries it when the turn has nothing else).
    Fields a message does not need — ids, statuses, training token ids — are left out.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = [{"role": "user", "content": input_}] if isinstance(input_, str) else input_
    turn: dict[str, Any] | None = None  # the assistant message that function calls join
    pending: list[str] = []  # reasoning waiting for its turn's assistant message

    def open_turn(message: dict[str, Any]) -> dict[str, Any]:
        if pending:
            _attach_reasoning(message, "\n\n".join(pending), reasoning)
            pending.clear()
        messages.append(message)
        return message

    def flush() -> None:
        if pending:
            open_turn({"role": "assistant", "content": ""})

    for item in items:
        kind = item_type(item)
        if kind == "message":
            role = item.get("role", "user")
            message = {"role": role, "content": _content_to_chat(item.get("content"))}
            if role == "assistant":
                turn = open_turn(message)
            else:
                flush()
                messages.append(message)
                turn = None
        elif kind == "function_call":
            if turn is None:
                turn = open_turn({"role": "assistant", "content": None})
            if not turn.get("content"):
                turn["content"] = None
            turn.setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id") or item.get("id") or new_id("call"),
                    "type": "function",
                    "function": {
                        "name": item.get("name", ""),
                        "arguments": _arguments(item.get("arguments")),
                    },
                }
            )
        elif kind == "function_call_output":
            flush()
            output = item.get("output", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else content_text(output),
                }
            )
            turn = None
        elif kind == "reasoning":
            text = reasoning_text(item)
            if text and reasoning != "drop":
                pending.append(text)
                turn = None
        # other Responses-only items have no Chat Completions counterpart
    flush()
    return messages


def messages_to_input(
    messages: list[dict[str, Any]], *, reasoning_output: ReasoningOutput = "summary"
) -> list[dict[str, Any]]:
    """Chat ``messages`` -> Responses ``input`` items (system/developer messages stay messages).

    An assistant message's ``reasoning_content`` / ``reasoning`` becomes a ``reasoning`` item before
    its text and calls. ``<think>`` tags inside a history's content are left as written.
    """
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "user")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": content_text(message.get("content")),
                }
            )
            continue
        if role == "assistant":
            thought = message_reasoning(message)
            if thought:
                item = reasoning_item(thought, reasoning_output)
                del item["id"]  # input items need none; an invented id would only look like a real one
                items.append(item)
        content = _content_from_chat(message.get("content"))
        if content or role != "assistant":
            items.append({"type": "message", "role": role, "content": content})
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id") or new_id("call"),
                    "name": function.get("name", ""),
                    "arguments": _arguments(function.get("arguments")),
                }
            )
    return items


def _arguments(raw: Any) -> str:
    """Function arguments as the JSON string both APIs use (some servers send an object)."""
    if raw is None or raw == "":
        return "{}"
    return raw if isinstance(raw, str) else orjson.dumps(raw).decode()


# ------------------------------------------------------------------------------------------- tools


def tools_to_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Responses function tools -> Chat tools; other tool types have no Chat counterpart."""
    converted = []
    for tool in tools or []:
        if tool.get("type", "function") != "function":
            continue
        if "function" in tool:  # already in Chat form
            converted.append(tool)
            continue
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
        }
        converted.append({"type": "function", "function": function})
    return converted


def tools_from_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tools -> Responses function tools (a tool already in Responses form is kept)."""
    converted = []
    for tool in tools or []:
        function = tool.get("function")
        if not isinstance(function, dict):
            if tool.get("type", "function") == "function" and "name" in tool:
                converted.append(tool)
            continue
        flat = {"type": "function", "name": function.get("name", "")}
        for key in ("description", "parameters", "strict"):
            if function.get(key) is not None:
                flat[key] = function[key]
        converted.append(flat)
    return converted


def tool_choice_to_chat(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def tool_choice_from_chat(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name", "")}
    return choice


def text_format_to_chat(text: Any) -> dict[str, Any] | None:
    """Responses ``text.format`` (structured output) -> Chat ``response_format``; None for plain text."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return {k: v for k, v in fmt.items()}


def text_format_from_chat(response_format: Any) -> dict[str, Any] | None:
    """Chat ``response_format`` -> Responses ``text``; None for plain text."""
    if not isinstance(response_format, dict) or response_format.get("type") in (None, "text"):
        return None
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema") or {}
        return {"format": {"type": "json_schema", **schema}}
    return {"format": dict(response_format)}


# ------------------------------------------------------------------------------------------- usage


def usage_to_chat(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    chat: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        chat["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    thought = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    if thought is not None:
        chat["completion_tokens_details"] = {"reasoning_tokens": int(thought)}
    return chat


def usage_from_chat(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Chat usage -> Responses usage; token details are kept when the server reports them."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    converted: dict[str, Any] = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        converted["input_tokens_details"] = {"cached_tokens": int(cached)}
    thought = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if thought is not None:
        converted["output_tokens_details"] = {"reasoning_tokens": int(thought)}
    return converted


# ---------------------------------------------------------------------------------------- requests


def responses_request_to_chat(
    body: dict[str, Any], *, reasoning: ReasoningHistory = "reasoning_content"
) -> dict[str, Any]:
    """A ``POST /v1/responses`` body -> a ``POST /v1/chat/completions`` body.

    Only fields with a Chat counterpart are carried; Responses-only fields (``store``,
    ``include``, ``previous_response_id``, unknown extensions, ...) are not sent on.
    """
    chat: dict[str, Any] = {
        "messages": input_to_messages(body.get("input", []), body.get("instructions"), reasoning=reasoning)
    }
    if body.get("model") is not None:
        chat["model"] = body["model"]
    tools = tools_to_chat(body.get("tools"))
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = tool_choice_to_chat(body["tool_choice"])
    for source, target in _SAMPLING_FIELDS.items():
        if body.get(source) is not None:
            chat[target] = body[source]
    response_format = text_format_to_chat(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def chat_request_to_responses(body: dict[str, Any]) -> dict[str, Any]:
    """A ``POST /v1/chat/completions`` body -> a ``POST /v1/responses`` body."""
    params: dict[str, Any] = {"input": messages_to_input(body.get("messages") or [])}
    if body.get("model") is not None:
        params["model"] = body["model"]
    tools = tools_from_chat(body.get("tools"))
    if tools:
        params["tools"] = tools
    if body.get("tool_choice") is not None:
        params["tool_choice"] = tool_choice_from_chat(body["tool_choice"])
    for source, target in _SAMPLING_FIELDS.items():
        if body.get(target) is not None:
            params[source] = body[target]
    if body.get("max_completion_tokens") is not None:
        params["max_output_tokens"] = body["max_completion_tokens"]
    text = text_format_from_chat(body.get("response_format"))
    if text is not None:
        params["text"] = text
    if body.get("reasoning_effort") is not None:
        params["reasoning"] = {"effort": body["reasoning_effort"]}
    return params


# ----------------------------------------------------------------------------------------- replies

# Responses object fields echoed from the request, with the API's defaults when the request has none;
# the official SDK's Response type expects them.
ECHOED_RESPONSE_FIELDS: dict[str, Any] = {
    "instructions": None,
    "metadata": None,
    "temperature": None,
    "top_p": None,
    "max_output_tokens": None,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
}

_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def chat_completion_to_response(
    completion: dict[str, Any],
    model: str | None = None,
    *,
    request: dict[str, Any] | None = None,
    parse_think: bool = True,
    reasoning_output: ReasoningOutput = "summary",
) -> dict[str, Any]:
    """A chat completion object -> a Responses object (first choice).

    Output order is reasoning, message, function calls — the order the model produced them. A reply
    with nothing in it still yields one (empty) assistant message, so that every model call has an
    item to carry its token ids and callers see an answer rather than an empty list. With
    ``request`` (the Responses create body), the request fields the Responses object reports are
    echoed. ``finish_reason`` "length" gives ``status: "incomplete"`` with reason
    ``max_output_tokens``.
    """
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    text = content_text(message.get("content"))
    thought: str | None = message_reasoning(message) or None
    if thought is None and parse_think and (THINK_OPEN in text or THINK_CLOSE in text):
        thought, text = split_think(text)
    output: list[dict[str, Any]] = []
    tool_calls = message.get("tool_calls") or []
    if thought:
        output.append(reasoning_item(thought, reasoning_output))
    if text.strip() or (text and not thought and not tool_calls):
        output.append(message_item(text))  # not the bare newlines some templates leave before calls
    for call in tool_calls:
        function = call.get("function") or {}
        output.append(
            function_call_item(
                function.get("name", ""), _arguments(function.get("arguments")), call.get("id")
            )
        )
    return converted_response(
        output,
        model or str(completion.get("model", "")),
        usage_from_chat(completion.get("usage")),
        request,
        _INCOMPLETE_REASONS.get(str(choice.get("finish_reason"))),
    )


def converted_response(
    output: list[dict[str, Any]],
    model: str,
    usage: dict[str, Any],
    request: dict[str, Any] | None,
    incomplete_reason: str | None,
) -> dict[str, Any]:
    """The Responses object of a reply converted from another dialect (Chat Completions, Messages):
    never an empty output, the request's parameters echoed, ``incomplete`` when the reply was cut."""
    if not output:
        output.append(message_item(""))
    extra: dict[str, Any] = {"error": None, "incomplete_details": None}
    if request is not None:
        extra.update({key: request.get(key, default) for key, default in ECHOED_RESPONSE_FIELDS.items()})
        extra["tools"] = request.get("tools") or []
    status = "completed"
    if incomplete_reason is not None:
        status = "incomplete"
        extra["incomplete_details"] = {"reason": incomplete_reason}
    return new_response(output, model, usage, status=status, **extra)


def response_to_chat_completion(response: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """A Responses object -> a chat completion object with one choice.

    Reasoning items come back as the message's ``reasoning_content``.
    """
    texts: list[str] = []
    thoughts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        kind = item_type(item)
        if kind == "message" and item.get("role", "assistant") == "assistant":
            texts.append(content_text(item.get("content")))
        elif kind == "reasoning":
            thought = reasoning_text(item)
            if thought:
                thoughts.append(thought)
        elif kind == "function_call":
            tool_calls.append(
                {
                    "id": item.get("call_id") or new_id("call"),
                    "type": "function",
                    "function": {
                        "name": item.get("name", ""),
                        "arguments": _arguments(item.get("arguments")),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thoughts:
        message["reasoning_content"] = "\n\n".join(thoughts)
    if tool_calls:
        message["tool_calls"] = tool_calls
        finish = "tool_calls"
    elif response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        finish = "content_filter" if reason == "content_filter" else "length"
    else:
        finish = "stop"
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(response.get("created_at") or time.time()),
        "model": model or str(response.get("model", "")),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage_to_chat(response.get("usage")),
    }
