"""Converting between the OpenAI Responses and Chat Completions shapes.

polygym speaks Responses everywhere (DESIGN §3), but many policies are only reachable through Chat
Completions (vLLM, most local servers), and some callers only speak Chat Completions. This module is
the one place that maps between the two, in both directions:

- requests: ``responses_request_to_chat`` / ``chat_request_to_responses``
- replies: ``chat_completion_to_response`` / ``response_to_chat_completion``
- pieces: messages <-> input items, tools, tool choice, usage.

Scope, on purpose: messages of the roles system/developer/user/assistant with text (and image) content,
function calls and their outputs, function tools, the common sampling fields and token usage. Shapes
with no counterpart on the other side (built-in tools such as web search, Responses-only item types
other than ``reasoning``) are left out rather than approximated. Everything here is pure data in,
data out: no I/O, no validation beyond what the mapping needs.
"""

from __future__ import annotations

import time
from typing import Any

from polygym.protocol import function_call_item, message_item, new_id, new_response

MESSAGE_ROLES = ("system", "developer", "user", "assistant")

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


# ---------------------------------------------------------------------------------- conversation


def item_type(item: dict[str, Any]) -> str:
    """The item's type; a bare ``{"role", "content"}`` input item is a message."""
    return str(item.get("type") or ("message" if "role" in item else ""))


def input_to_messages(
    input_: str | list[dict[str, Any]], instructions: str | None = None
) -> list[dict[str, Any]]:
    """Responses ``input`` (+ ``instructions``) -> Chat ``messages``.

    Consecutive function calls (and an assistant message just before them) become one assistant
    message with ``tool_calls``, which is how Chat Completions represents one model turn.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = [{"role": "user", "content": input_}] if isinstance(input_, str) else input_
    turn: dict[str, Any] | None = None  # the assistant message that function calls join
    for item in items:
        kind = item_type(item)
        if kind == "message":
            role = item.get("role", "user")
            message = {"role": role, "content": _content_to_chat(item.get("content"))}
            messages.append(message)
            turn = message if role == "assistant" else None
        elif kind == "function_call":
            if turn is None:
                turn = {"role": "assistant", "content": None}
                messages.append(turn)
            if not turn.get("content"):
                turn["content"] = None
            turn.setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id") or item.get("id") or new_id("call"),
                    "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"},
                }
            )
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else content_text(output),
                }
            )
            turn = None
        # reasoning and other Responses-only items have no Chat Completions counterpart
    return messages


def messages_to_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat ``messages`` -> Responses ``input`` items (system/developer messages stay messages)."""
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
                    "arguments": function.get("arguments") or "{}",
                }
            )
    return items


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


# ------------------------------------------------------------------------------------------- usage


def usage_to_chat(usage: dict[str, Any] | None) -> dict[str, int]:
    usage = usage or {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def usage_from_chat(usage: dict[str, Any] | None) -> dict[str, int]:
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


# ---------------------------------------------------------------------------------------- requests


def responses_request_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A ``POST /v1/responses`` body -> a ``POST /v1/chat/completions`` body."""
    chat: dict[str, Any] = {"messages": input_to_messages(body.get("input", []), body.get("instructions"))}
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
    return params


# ----------------------------------------------------------------------------------------- replies


def chat_completion_to_response(completion: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """A chat completion object -> a Responses object (first choice)."""
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": new_id("rs"),
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    text = content_text(message.get("content"))
    if text:
        output.append(message_item(text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            function_call_item(function.get("name", ""), function.get("arguments") or "{}", call.get("id"))
        )
    extra: dict[str, Any] = {}
    status = "completed"
    if choice.get("finish_reason") == "length":
        status = "incomplete"
        extra["incomplete_details"] = {"reason": "max_output_tokens"}
    return new_response(
        output,
        model or str(completion.get("model", "")),
        usage_from_chat(completion.get("usage")),
        status=status,
        **extra,
    )


def response_to_chat_completion(response: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """A Responses object -> a chat completion object with one choice."""
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        kind = item_type(item)
        if kind == "message" and item.get("role", "assistant") == "assistant":
            texts.append(content_text(item.get("content")))
        elif kind == "function_call":
            tool_calls.append(
                {
                    "id": item.get("call_id") or new_id("call"),
                    "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
        finish = "tool_calls"
    else:
        finish = "length" if response.get("status") == "incomplete" else "stop"
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(response.get("created_at") or time.time()),
        "model": model or str(response.get("model", "")),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage_to_chat(response.get("usage")),
    }
