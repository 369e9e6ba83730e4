"""polygym.dialects.messages: Responses <-> Anthropic Messages, both directions.

Pure data in, data out: requests with system prompts, tools, tool use and results, thinking and
images; replies with every stop reason; usage with cache reads; the SSE stream; error bodies.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from polygym.dialects import messages as md

TOOL = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FUNCTION_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": TOOL["input_schema"],
}

REQUEST: dict[str, Any] = {
    "model": "claude-x",
    "max_tokens": 256,
    "system": [{"type": "text", "text": "Be terse."}],
    "temperature": 0.2,
    "top_k": 5,
    "stop_sequences": ["END"],
    "tools": [TOOL, {"type": "web_search_20250305", "name": "web_search"}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    "metadata": {"user_id": "u1"},
    "messages": [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "cold"}],
                },
                {"type": "text", "text": "And "},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ],
        },
    ],
}


def test_request_to_responses_maps_every_field() -> None:
    md.check_request(REQUEST)
    params = md.messages_request_to_responses(REQUEST)
    assert params["input"] == [
        {"type": "message", "role": "user", "content": "weather in Oslo?"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "Look it up."}],
            "encrypted_content": "sig-1",
        },
        {"type": "message", "role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "toolu_1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call_output", "call_id": "toolu_1", "output": "cold"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "And "},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        },
    ]
    assert params["instructions"] == "Be terse."
    assert params["tools"] == [FUNCTION_TOOL]  # the server tool has no Responses counterpart
    assert (params["tool_choice"], params["parallel_tool_calls"]) == ("required", False)
    assert (params["max_output_tokens"], params["temperature"], params["top_k"]) == (256, 0.2, 5)
    assert (params["stop"], params["user"], params["model"]) == (["END"], "u1", "claude-x")


def test_request_round_trips_through_responses() -> None:
    """Messages -> Responses -> Messages keeps the conversation (blocks, order, ids, signature)."""
    params = md.messages_request_to_responses(REQUEST)
    back = md.responses_request_to_messages(params, max_tokens=1)
    assert back["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo?"}]},
        REQUEST["messages"][1],
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"},
                {"type": "text", "text": "And "},
                REQUEST["messages"][2]["content"][2],
            ],
        },
    ]
    assert back["system"] == "Be terse."
    assert back["tools"] == [TOOL]
    assert back["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert (back["max_tokens"], back["stop_sequences"], back["metadata"]) == (256, ["END"], {"user_id": "u1"})
    assert (back["temperature"], back["top_k"]) == (0.2, 5)


def test_responses_input_to_messages_groups_turns_and_lifts_system() -> None:
    body = {
        "instructions": "Rules.",
        "input": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "unsigned"}]},
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ],
        "tool_choice": {"type": "function", "name": "a"},
        "tools": [FUNCTION_TOOL],
        "metadata": {"script": "[]"},
    }
    request = md.responses_request_to_messages(body, max_tokens=99)
    assert request["system"] == "Rules.\n\nBe terse."
    assert request["max_tokens"] == 99
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",  # the unsigned reasoning item is not sent: Anthropic would refuse it
            "content": [
                {"type": "tool_use", "id": "c1", "name": "a", "input": {}},
                {
                    "type": "tool_use",
                    "id": "c2",
                    "name": "b",
                    "input": {md.UNPARSED_ARGUMENTS_KEY: "not json"},
                },
            ],
        },
        {
            "role": "user",  # tool results first, as Anthropic requires
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
                {"type": "text", "text": "more"},
            ],
        },
    ]
    assert request["tool_choice"] == {"type": "tool", "name": "a"}
    assert "metadata" not in request  # Anthropic accepts only user_id there


def test_string_input_and_parallel_flag_without_choice() -> None:
    request = md.responses_request_to_messages(
        {"input": "hello", "tools": [FUNCTION_TOOL], "parallel_tool_calls": False, "max_output_tokens": 7},
        max_tokens=99,
    )
    assert request["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert request["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert request["max_tokens"] == 7


RESPONSE: dict[str, Any] = {
    "model": "scripted",
    "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{oops"},
    ],
    "usage": {"input_tokens": 30, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 10}},
}


def test_response_to_message() -> None:
    message = md.response_to_message(RESPONSE)
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("msg_")
    assert message["model"] == "scripted"
    assert message["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}},
        {
            "type": "tool_use",
            "id": "c2",
            "name": "get_weather",
            "input": {md.UNPARSED_ARGUMENTS_KEY: "{oops"},
        },
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 20,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 10,
    }


@pytest.mark.parametrize(
    ("status", "details", "stop_reason"),
    [
        ("completed", None, "end_turn"),
        ("incomplete", {"reason": "max_output_tokens"}, "max_tokens"),
        ("incomplete", {"reason": "content_filter"}, "refusal"),
    ],
)
def test_stop_reasons(status: str, details: dict[str, Any] | None, stop_reason: str) -> None:
    response = {"status": status, "incomplete_details": details, "output": [RESPONSE["output"][1]]}
    message = md.response_to_message(response)
    assert message["stop_reason"] == stop_reason
    back = md.message_to_response(message)
    assert back["status"] == status
    assert back["incomplete_details"] == details


def test_message_to_response_keeps_block_order_and_echoes_request() -> None:
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "text", "text": "Let me "},
            {"type": "text", "text": "check."},
            {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Rome"}},
        ],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 5,
            "cache_read_input_tokens": 7,
            "cache_creation_input_tokens": 1,
            "output_tokens": 3,
        },
    }
    request = {"input": "x", "tools": [FUNCTION_TOOL], "temperature": 0.5}
    response = md.message_to_response(reply, "policy", request=request)
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning, text, call = response["output"]
    assert (reasoning["summary"][0]["text"], reasoning["encrypted_content"]) == ("plan", "sig")
    assert text["content"][0]["text"] == "Let me check."
    assert (call["call_id"], call["name"], orjson.loads(call["arguments"])) == (
        "toolu_9",
        "get_weather",
        {"city": "Rome"},
    )
    assert response["usage"] == {
        "input_tokens": 13,
        "output_tokens": 3,
        "total_tokens": 16,
        "input_tokens_details": {"cached_tokens": 7},
    }
    assert (response["model"], response["status"], response["temperature"]) == ("policy", "completed", 0.5)
    assert response["tools"] == [FUNCTION_TOOL]
    assert md.message_to_response({"content": []})["output"][0]["content"][0]["text"] == ""


def test_unparsed_arguments_round_trip_unchanged() -> None:
    message = md.response_to_message({"output": [RESPONSE["output"][3]]})
    back = md.message_to_response(message)
    assert back["output"][0]["arguments"] == "{oops"


def test_events_rebuild_the_message() -> None:
    """Replaying the stream as a client accumulates it gives back the message."""
    message = md.response_to_message(RESPONSE)
    events = md.message_events(message)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    rebuilt: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "message_start":
            rebuilt = data["message"]
            assert rebuilt["content"] == [] and rebuilt["stop_reason"] is None
        elif name == "content_block_start":
            assert data["index"] == len(rebuilt["content"])
            rebuilt["content"].append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = rebuilt["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                block["signature"] += delta["signature"]
        elif name == "content_block_stop" and data["index"] in partial:
            rebuilt["content"][data["index"]]["input"] = orjson.loads(partial[data["index"]])
        elif name == "message_delta":
            rebuilt.update(data["delta"])
            rebuilt["usage"] = data["usage"]
    assert rebuilt == message
    body = md.sse_body(events).decode()
    assert body.startswith("event: message_start\ndata: {")
    assert body.count("\n\n") == len(events)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "request body"),
        ({"max_tokens": 5}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages.0"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages.0.content.0.type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use"}]},
                ]
            },
            "messages.1.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        ({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "a"}], "max_tokens": True}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "a"}], "system": [{"type": "image"}]}, "system.0.type"),
        ({"messages": [{"role": "user", "content": "a"}], "tools": [{"input_schema": {}}]}, "tools.0"),
        ({"messages": [{"role": "user", "content": "a"}], "tool_choice": "auto"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "a"}], "stream": "yes"}, "stream"),
    ],
)
def test_check_request_names_the_field(body: Any, field: str) -> None:
    with pytest.raises(md.MessagesRequestError) as caught:
        md.check_request(body)
    assert str(caught.value).startswith(field)


def test_error_bodies() -> None:
    assert orjson.loads(md.error_body(400, "bad")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert orjson.loads(md.error_body(429, "x"))["error"]["type"] == "rate_limit_error"
    assert orjson.loads(md.error_body(502, "x"))["error"]["type"] == "api_error"
    assert orjson.loads(md.error_body(422, "x"))["error"]["type"] == "invalid_request_error"
    assert md.is_error_body(orjson.loads(md.error_body(529, "x")))
    assert not md.is_error_body({"error": {"type": "x", "message": "y"}})
