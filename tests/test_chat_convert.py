"""polygym.chat_convert: Responses <-> Chat Completions, both directions.

(Kept next to the scripted model, its first user, because this checkout assigns ``tests/`` to
other work; it tests only ``polygym.chat_convert``.)
"""

from __future__ import annotations

from polygym import chat_convert as cc

INPUT = [
    {"role": "developer", "content": "Be terse."},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Oslo?"}],
    },
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
    {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "cold"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
]

MESSAGES = [
    {"role": "system", "content": "sys"},
    {"role": "developer", "content": "Be terse."},
    {"role": "user", "content": "weather in Oslo?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
]


def test_input_to_messages_groups_one_assistant_turn() -> None:
    assert cc.input_to_messages(INPUT, instructions="sys") == MESSAGES
    assert cc.input_to_messages("hi") == [{"role": "user", "content": "hi"}]


def test_calls_without_text_get_null_content() -> None:
    items = [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    assistant = cc.input_to_messages(items)[1]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["id"] == "c1"


def test_messages_to_input_round_trip() -> None:
    items = cc.messages_to_input(MESSAGES)
    assert [cc.item_type(i) for i in items] == [
        "message",
        "message",
        "message",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert items[4] == {
        "type": "function_call",
        "call_id": "c1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }
    assert items[7] == {"type": "function_call_output", "call_id": "c2", "output": "noon"}
    assert cc.input_to_messages(items) == MESSAGES


def test_image_parts_both_ways() -> None:
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        }
    ]
    items = cc.messages_to_input(chat)
    assert items[0]["content"] == [
        {"type": "input_text", "text": "what?"},
        {"type": "input_image", "image_url": "data:x"},
    ]
    assert cc.input_to_messages(items) == chat


def test_tools_and_tool_choice() -> None:
    flat = [
        {
            "type": "function",
            "name": "f",
            "description": "d",
            "parameters": {"type": "object"},
            "strict": True,
        },
        {"type": "web_search"},
    ]
    chat = cc.tools_to_chat(flat)
    assert chat == [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert cc.tools_from_chat(chat) == flat[:1]
    assert cc.tool_choice_to_chat({"type": "function", "name": "f"}) == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert cc.tool_choice_from_chat({"type": "function", "function": {"name": "f"}}) == {
        "type": "function",
        "name": "f",
    }
    assert cc.tool_choice_to_chat("required") == "required"


def test_requests_both_ways() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "instructions": "sys",
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": "auto",
        "temperature": 0.2,
        "max_output_tokens": 64,
    }
    chat = cc.responses_request_to_chat(body)
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "temperature": 0.2,
        "max_tokens": 64,
    }
    back = cc.chat_request_to_responses({**chat, "max_tokens": None, "max_completion_tokens": 32})
    assert back["max_output_tokens"] == 32
    assert back["tools"] == [{"type": "function", "name": "f", "parameters": {}}]
    assert back["input"][0] == {"type": "message", "role": "system", "content": "sys"}


def test_replies_both_ways() -> None:
    completion = {
        "id": "x",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "reasoning_content": "think",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    response = cc.chat_completion_to_response(completion)
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][2]["call_id"] == "c1"
    assert response["usage"] == {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}
    assert response["status"] == "completed"

    again = cc.response_to_chat_completion(response)
    choice = again["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    assert choice["message"]["tool_calls"] == completion["choices"][0]["message"]["tool_calls"]
    assert again["usage"] == completion["usage"]

    truncated = cc.chat_completion_to_response(
        {"choices": [{"message": {"content": "abc"}, "finish_reason": "length"}]}
    )
    assert truncated["status"] == "incomplete"
    assert truncated["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cc.response_to_chat_completion(truncated)["choices"][0]["finish_reason"] == "length"
