"""A rollout as a person reads it: the conversation in order, each tool call next to its output.

A rollout row holds the prompt (``responses_create_params.input``: a string or a list of
messages and items) and the Responses ``output`` items the agent produced. The output lists a
``function_call`` and, later, the ``function_call_output`` with the same ``call_id``; reading
them apart means scrolling back and forth, so ``conversation`` puts each output inside its call's
block (an output with no call, or a call with no output, still shows on its own).

Everything here is model output: texts are kept as plain strings for the templates to escape, and
a text longer than ``MAX_TEXT`` characters is cut with a note, so one runaway answer cannot make
the page unusable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 100_000
MODEL_ITEMS = ("message", "function_call", "reasoning")


@dataclass
class Block:
    kind: str
    """``message``, ``reasoning``, ``tool`` (a call and its output) or ``item`` (anything else, as JSON)."""
    role: str = ""
    text: str = ""
    name: str = ""
    arguments: str = ""
    output: str | None = None
    call_id: str = ""
    cut: int = 0
    """Characters left out of the longest text of this block (0: nothing cut)."""


def _cut(text: str) -> tuple[str, int]:
    if len(text) <= MAX_TEXT:
        return text, 0
    return text[:MAX_TEXT], len(text) - MAX_TEXT


def _text_of(content: Any) -> str:
    """The readable text of a message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                value = part.get("text", part.get("refusal"))
                parts.append(value if isinstance(value, str) else json.dumps(part, ensure_ascii=False))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _pretty(arguments: Any) -> str:
    """Tool arguments indented when they are JSON (a model may also emit broken JSON: shown raw)."""
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _output_text(output: Any) -> str:
    return output if isinstance(output, str) else _text_of(output)


def _block(item: Mapping[str, Any]) -> Block:
    kind = item.get("type") or ("message" if "role" in item else "")
    if kind == "message":
        text, cut = _cut(_text_of(item.get("content")))
        return Block("message", role=str(item.get("role", "assistant")), text=text, cut=cut)
    if kind == "reasoning":
        summary = _text_of(item.get("summary")) or _text_of(item.get("content"))
        text, cut = _cut(summary)
        return Block("reasoning", role="assistant", text=text, cut=cut)
    if kind == "function_call":
        arguments, cut = _cut(_pretty(item.get("arguments", "")))
        return Block(
            "tool",
            name=str(item.get("name", "")),
            arguments=arguments,
            call_id=str(item.get("call_id", "")),
            cut=cut,
        )
    if kind == "function_call_output":
        output, cut = _cut(_output_text(item.get("output")))
        return Block("tool", output=output, call_id=str(item.get("call_id", "")), cut=cut)
    text, cut = _cut(json.dumps(item, indent=2, ensure_ascii=False))
    return Block("item", role=str(kind), text=text, cut=cut)


def _items(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, Mapping) else None
    items: list[Mapping[str, Any]] = []
    if isinstance(prompt, str):
        items.append({"type": "message", "role": "user", "content": prompt})
    elif isinstance(prompt, list):
        items.extend(i for i in prompt if isinstance(i, Mapping))
    response = row.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if isinstance(output, list):
        items.extend(i for i in output if isinstance(i, Mapping))
    return items


def conversation(row: Mapping[str, Any]) -> list[Block]:
    """The prompt and the output of ``row`` as display blocks, outputs joined to their calls."""
    blocks: list[Block] = []
    calls: dict[str, Block] = {}
    for item in _items(row):
        block = _block(item)
        if block.kind == "tool" and block.output is not None and block.call_id in calls:
            call = calls.pop(block.call_id)
            call.output, call.cut = block.output, max(call.cut, block.cut)
            continue
        if block.kind == "tool" and block.output is None and block.call_id:
            calls[block.call_id] = block
        blocks.append(block)
    return blocks


def count_turns(response: Any) -> int:
    """Model turns of a rollout: runs of model items between tool outputs (0 without a response)."""
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        return 0
    turns, in_turn = 0, False
    for item in output:
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind in MODEL_ITEMS:
            turns += not in_turn
            in_turn = True
        else:
            in_turn = False
    return turns
