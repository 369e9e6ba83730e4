"""Reading tool calls out of a small model's text, and constraining it to produce well-formed ones.

Small instruction-tuned models know *what* to call but not reliably *how to wrap it*: Qwen2.5-Coder
0.5B writes correct ``{"name": ..., "arguments": ...}`` JSON, but as often bare or inside a
Markdown fence as inside the ``<tool_call>`` tags its chat template asks for, so a strict parser
(llama.cpp's own) misses most calls. Two complementary defences live here:

- :func:`parse_tool_calls`, a **lenient parser**: it accepts ``<tool_call>`` blocks (closed or cut
  off), fenced JSON, bare JSON objects or lists of them, and a call object embedded in prose; the
  call may be ``{"name", "arguments"}`` (or ``parameters``/``args``), or the OpenAI shape
  ``{"function": {"name", "arguments"}}``; arguments may be an object or a JSON string. Anything
  that is not a call stays text.
- :func:`build_grammar`, a **constraint**: a grammar (llguidance's Lark dialect, which the bundled
  llama.cpp evaluates during sampling) admitting exactly "one of the offered tools with arguments
  valid for its schema, in any of the three wrappings the model likes" or "a plain-text answer".
  Accepting the wrappings the model already prefers keeps it in distribution — forcing the tags alone
  made it give up on tools and talk instead. An answer may not start like a call (``{``, ``[``,
  ``<``, a fence), so a malformed call cannot slip out as text.

Tool schemas are first reduced to a conservative subset of JSON Schema (:func:`sanitize_schema`):
llama.cpp silently drops a grammar it cannot compile, so an exotic keyword must never be allowed
to switch the constraint off.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Keywords kept by sanitize_schema: the structural core every grammar engine supports. Everything
# else (formats, patterns, $ref, conditionals, ...) is dropped, which only loosens the constraint.
_KEEP_SCALAR = {
    "type",
    "enum",
    "const",
    "required",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
}
_JSON_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
_MAX_DEPTH = 16

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"```[A-Za-z_]*[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_CALL_START = re.compile(r"[\[{]\s*(?:\{\s*)?\"(?:name|function|type)\"\s*:")
_DECODER = json.JSONDecoder()


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        """Canonical form, so that the same call written two ways compares equal."""
        return json.dumps([self.name, self.arguments], sort_keys=True, separators=(",", ":"))


@dataclass
class ParsedTurn:
    """A model turn split into its plain text and its tool calls (in order)."""

    text: str
    calls: list[ParsedCall] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ parsing


def _as_call(value: Any) -> ParsedCall | None:
    """A call from one decoded JSON value, accepting the shapes models commonly write."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments: Any = {}
    for key in ("arguments", "parameters", "args", "input"):
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name.strip(), arguments)


def _as_calls(value: Any) -> list[ParsedCall] | None:
    """All calls of a decoded value (an object or a list of objects); None if any is not a call."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_as_call(item) for item in items]
    if any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _decode_all(text: str) -> list[ParsedCall] | None:
    """Calls from a text holding only JSON call values (separated by whitespace or commas)."""
    calls: list[ParsedCall] = []
    position = 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] == ","):
            position += 1
        if position >= len(text):
            return calls or None
        try:
            value, position = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError:
            return None
        found = _as_calls(value)
        if found is None:
            return None
        calls.extend(found)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Split ``text`` into plain text and tool calls; text that holds no call is returned as is."""
    calls: list[ParsedCall] = []
    kept: list[str] = []

    def take_blocks(pattern: re.Pattern[str], source: str) -> str:
        out, last = [], 0
        for match in pattern.finditer(source):
            found = _decode_all(match.group(1))
            if found is None:
                continue
            calls.extend(found)
            out.append(source[last : match.start()])
            last = match.end()
        out.append(source[last:])
        return "".join(out)

    rest = take_blocks(_TAGGED, text)
    rest = take_blocks(_FENCE, rest)
    # Bare JSON: a call object (or list of them) wherever it starts, e.g. after a sentence.
    position = 0
    while match := _CALL_START.search(rest, position):
        try:
            value, end = _DECODER.raw_decode(rest, match.start())
        except json.JSONDecodeError:
            position = match.start() + 1
            continue
        found = _as_calls(value)
        if found is None:
            position = match.start() + 1
            continue
        calls.extend(found)
        kept.append(rest[position : match.start()])
        position = end
    kept.append(rest[position:])
    remaining = "".join(kept) if calls else text
    return ParsedTurn(remaining.strip() if calls else remaining, calls)


# ------------------------------------------------------------------------------------------ schemas


def sanitize_schema(
    schema: Any, depth: int = 0, max_items: int | None = None, keep_descriptions: bool = False
) -> dict[str, Any]:
    """A copy of ``schema`` reduced to keywords every grammar engine compiles (see module doc).

    Objects without ``additionalProperties`` get ``false``: a model that may add keys at will
    invents them (``"required": [...]`` inside the arguments was a favourite). Arrays without
    ``maxItems`` get ``max_items`` when given: a small model that starts repeating itself inside
    a JSON list (``[2008, 2008, 2008, ...``) otherwise runs to the token limit. With
    ``keep_descriptions`` the ``description`` texts stay (for showing the schema to the model).
    """
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    out: dict[str, Any] = {}
    if keep_descriptions and isinstance(schema.get("description"), str):
        out["description"] = schema["description"]
    for key in _KEEP_SCALAR:
        if key in schema:
            out[key] = schema[key]
    kind = out.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k in _JSON_TYPES]
        out["type"] = kinds if kinds else None
    elif kind is not None and kind not in _JSON_TYPES:
        out["type"] = None
    if out.get("type") is None:
        out.pop("type", None)
    if "required" in out and not (
        isinstance(out["required"], list) and all(isinstance(r, str) for r in out["required"])
    ):
        del out["required"]
    if "enum" in out and not (isinstance(out["enum"], list) and out["enum"]):
        del out["enum"]
    for key in ("anyOf", "oneOf"):
        options = [
            sanitize_schema(o, depth + 1, max_items, keep_descriptions)
            for o in schema.get(key) or []
            if isinstance(o, dict)
        ]
        if options:
            out["anyOf"] = out.get("anyOf", []) + options
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {
            str(name): sanitize_schema(sub, depth + 1, max_items, keep_descriptions)
            for name, sub in schema["properties"].items()
        }
        if "required" in out:
            out["required"] = [r for r in out["required"] if r in out["properties"]]
    if isinstance(schema.get("items"), dict):
        out["items"] = sanitize_schema(schema["items"], depth + 1, max_items, keep_descriptions)
    if max_items is not None and out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = max(max_items, int(out.get("minItems") or 0))
    additional = schema.get("additionalProperties")
    is_object = out.get("type") == "object" or "properties" in out
    if isinstance(additional, bool):
        out["additionalProperties"] = additional
    elif isinstance(additional, dict):
        out["additionalProperties"] = sanitize_schema(additional, depth + 1, max_items, keep_descriptions)
    elif is_object:
        out["additionalProperties"] = False
    return out


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Offered function tools as ``{"name", "description", "parameters"}``, either API's shape."""
    found = []
    for tool in tools or []:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        spec = tool["function"] if isinstance(tool.get("function"), dict) else tool
        if isinstance(spec.get("name"), str) and spec["name"]:
            found.append(
                {
                    "name": spec["name"],
                    "description": spec.get("description") or "",
                    "parameters": spec.get("parameters") or {"type": "object", "properties": {}},
                }
            )
    return found


def call_schema(tools: list[dict[str, Any]], max_items: int | None = None) -> dict[str, Any]:
    """JSON Schema of one call ``{"name": <tool>, "arguments": <its parameters>}`` of any tool."""
    options = []
    for tool in tools:
        parameters = sanitize_schema(tool["parameters"], max_items=max_items)
        parameters.setdefault("type", "object")
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


# ------------------------------------------------------------------------------------------ grammar

ANSWER_PATTERN = r"/[^<>{}\[\]()`\s][^\x00]*/"
"""A plain-text answer: anything that does not start like a call (``{ [ ( < >``, a fence, a space)."""


@dataclass(frozen=True)
class CallTags:
    """How the model's template wraps a call: grammar literals for the opening and closing tag.

    For Qwen-family vocabularies ``<tool_call>`` is a single token; the grammar must then name it by
    id (``<[151657]>``) so the model emits that token rather than spelling the tag out in pieces.
    """

    open: str = '"<tool_call>"'
    close: str = '"</tool_call>"'


def build_grammar(
    tools: list[dict[str, Any]],
    *,
    allow_calls: bool = True,
    allow_answer: bool = True,
    max_calls: int = 1,
    answer_schema: dict[str, Any] | None = None,
    tags: CallTags | None = None,
    guard_answer: bool = True,
    max_array_items: int | None = None,
) -> str | None:
    """An llguidance grammar for one turn; None when nothing needs constraining.

    ``allow_calls`` without tools is impossible and treated as answer-only. With ``answer_schema``
    the answer must be JSON valid for it (structured outputs); otherwise it is free text, which
    with ``guard_answer`` (whenever the request offers tools) may not start like a call. Several
    calls in one turn are separated by a newline, at most ``max_calls`` of them; arrays in call
    arguments hold at most ``max_array_items`` unless their schema says otherwise.
    """
    tags = tags or CallTags()
    allow_calls = allow_calls and bool(tools)
    if not allow_calls and answer_schema is None and not guard_answer:
        return None
    lines = ["%llguidance {}"]
    if allow_calls and allow_answer:
        lines.append("start: calls | answer")
    elif allow_calls:
        lines.append("start: calls")
    else:
        lines.append("start: answer")
    if allow_calls:
        more = max(0, max_calls - 1)
        lines.append(f'calls: call ("\\n" call){{0,{more}}}' if more else "calls: call")
        lines.append("call: tagged | fenced | bare")
        lines.append(f'tagged: {tags.open} "\\n" tooljson "\\n" {tags.close}')
        lines.append('fenced: "```json\\n" tooljson "\\n```"')
        lines.append("bare: tooljson")
        schema = json.dumps(call_schema(tools, max_array_items), separators=(",", ":"))
        lines.append(f"tooljson: %json {schema}")
    if allow_answer or not allow_calls:
        if answer_schema is not None:
            schema = json.dumps(sanitize_schema(answer_schema), separators=(",", ":"))
            lines.append(f"answer: %json {schema}")
        else:
            lines.append(f"answer: {ANSWER_PATTERN}")
    return "\n".join(lines) + "\n"
