"""The lenient tool-call parser, schema sanitizing and the grammar builder (pure, no model)."""

from __future__ import annotations

import json

import pytest

from responses_api_models.local_model.tool_calls import (
    CallTags,
    ParsedCall,
    build_grammar,
    call_schema,
    function_tools,
    parse_tool_calls,
    sanitize_schema,
)

WEATHER = ParsedCall("get_weather", {"city": "Oslo"})


def test_bare_json() -> None:
    turn = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert turn.calls == [WEATHER]
    assert turn.text == ""


def test_fenced_json_pretty_printed() -> None:
    text = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```'
    turn = parse_tool_calls(text)
    assert turn.calls == [WEATHER]
    assert turn.text == ""


def test_tool_call_tags_closed_unclosed_and_several() -> None:
    closed = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert parse_tool_calls(closed).calls == [WEATHER]
    cut_off = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert parse_tool_calls(cut_off).calls == [WEATHER]
    two = closed + "\n" + closed.replace("Oslo", "Lima")
    assert [c.arguments["city"] for c in parse_tool_calls(two).calls] == ["Oslo", "Lima"]


def test_call_after_prose_keeps_the_prose() -> None:
    turn = parse_tool_calls('Let me check.\n{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert turn.calls == [WEATHER]
    assert turn.text == "Let me check."


def test_other_call_shapes() -> None:
    openai_shape = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert parse_tool_calls(json.dumps(openai_shape)).calls == [WEATHER]
    parameters = {"name": "get_weather", "parameters": {"city": "Oslo"}}
    assert parse_tool_calls(json.dumps(parameters)).calls == [WEATHER]
    listed = [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "noop"}]
    calls = parse_tool_calls(json.dumps(listed)).calls
    assert calls == [WEATHER, ParsedCall("noop", {})]


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Oslo is snow, -3 degrees.",
        '{"city": "Oslo", "weather": "snow"}',  # JSON, but not a call
        '{"name": "get_weather", "arguments": {"city": "Os',  # cut off mid-call
        '{"name": "get_weather", "arguments": "not json"}',
        "```python\nprint('hi')\n```",
        "<tool_call>\nnot json at all\n</tool_call>",
        "",
    ],
)
def test_garbage_stays_text(text: str) -> None:
    turn = parse_tool_calls(text)
    assert turn.calls == []
    assert turn.text == text


def test_call_key_ignores_formatting() -> None:
    a = parse_tool_calls('{"name": "f", "arguments": {"a": 1, "b": [1, 2]}}').calls[0]
    b = parse_tool_calls('```json\n{"name":"f","arguments":{"b":[1,2],"a":1}}\n```').calls[0]
    assert a.key() == b.key()


def test_sanitize_schema_keeps_structure_and_drops_exotic_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "weird-format", "pattern": "^x"},
            "ref": {"$ref": "#/nowhere"},
            "values": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            "mode": {"enum": ["a", "b"]},
        },
        "required": ["when", "missing"],
        "$defs": {"x": {}},
        "if": {"type": "object"},
    }
    clean = sanitize_schema(schema)
    assert clean == {
        "type": "object",
        "properties": {
            "when": {"type": "string"},
            "ref": {},
            "values": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            "mode": {"enum": ["a", "b"]},
        },
        "required": ["when"],
        "additionalProperties": False,
    }
    assert sanitize_schema({"type": "object", "additionalProperties": True})["additionalProperties"] is True
    capped = sanitize_schema(schema, max_items=8)["properties"]["values"]
    assert capped == {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 8}
    assert sanitize_schema({"type": "array", "maxItems": 100}, max_items=8)["maxItems"] == 100


def test_function_tools_accepts_both_shapes() -> None:
    flat = {"type": "function", "name": "a", "parameters": {"type": "object"}}
    nested = {"type": "function", "function": {"name": "b"}}
    other = {"type": "web_search"}
    assert [t["name"] for t in function_tools([flat, nested, other])] == ["a", "b"]


def test_call_schema_pins_name_and_arguments() -> None:
    tools = function_tools(
        [
            {"type": "function", "name": "a", "parameters": {"type": "object", "properties": {}}},
            {"type": "function", "name": "b"},
        ]
    )
    schema = call_schema(tools)
    assert [o["properties"]["name"] for o in schema["anyOf"]] == [{"const": "a"}, {"const": "b"}]
    assert all(o["required"] == ["name", "arguments"] for o in schema["anyOf"])


def test_grammar_shapes() -> None:
    tools = function_tools([{"type": "function", "name": "get_weather"}])
    tags = CallTags(open="<[151657]>", close="<[151658]>")
    both = build_grammar(tools, tags=tags)
    assert both is not None
    assert both.startswith("%llguidance {}\nstart: calls | answer\n")
    assert "tagged: <[151657]>" in both and "<[151658]>" in both
    assert "fenced:" in both and "bare: tooljson" in both
    assert '"const":"get_weather"' in both
    assert "calls: call\n" in both  # one call per turn by default
    assert 'calls: call ("\\n" call){0,2}' in str(build_grammar(tools, max_calls=3))
    calls_only = build_grammar(tools, allow_answer=False)
    assert calls_only is not None and "start: calls\n" in calls_only and "answer:" not in calls_only
    answer_only = build_grammar(tools, allow_calls=False)
    assert answer_only is not None and "start: answer\n" in answer_only and "tooljson" not in answer_only
    structured = build_grammar([], answer_schema={"type": "object"})
    assert structured is not None and "answer: %json" in structured
    assert build_grammar([], guard_answer=False) is None
