"""polygym.dialects.chat: Responses <-> Chat Completions, both directions.

Pure data in, data out: requests, replies, multi-turn histories with tool calls and reasoning (in
every shape servers use), token fields and usage, each converted and converted back.
"""

from __future__ import annotations

from typing import Any

import pytest

from polygym.dialects import chat as cc
from polygym.token_fields import TRAINING_TOKEN_FIELDS, attach_token_fields, strip_token_fields

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


# ------------------------------------------------------------------------------------ reasoning


def test_split_think_shapes() -> None:
    assert cc.split_think("<think>\nplan\n</think>\n\nAnswer") == ("plan", "Answer")
    assert cc.split_think("plan</think>Answer") == ("plan", "Answer")  # block opened by the template
    assert cc.split_think("<think>cut off by the lim") == ("cut off by the lim", "")
    assert cc.split_think("no tags") == (None, "no tags")
    assert cc.split_think("<think></think>Answer") == ("", "Answer")


def chat_reply(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "model": "m",
        "choices": [{"message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
    }


@pytest.mark.parametrize(
    "message",
    [
        {"content": "<think>weigh options</think>\n\nPick B."},
        {"content": "Pick B.", "reasoning_content": "weigh options"},
        {"content": "Pick B.", "reasoning": "weigh options"},
    ],
    ids=["think-tags", "reasoning_content", "reasoning"],
)
def test_reasoning_styles_round_trip(message: dict[str, Any]) -> None:
    response = cc.chat_completion_to_response(chat_reply(message))
    reasoning, answer = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [{"type": "summary_text", "text": "weigh options"}]
    assert cc.reasoning_text(reasoning) == "weigh options"
    assert answer["content"][0]["text"] == "Pick B."

    # back to chat: as a reply, and as history for the next call
    again = cc.response_to_chat_completion(response)["choices"][0]["message"]
    assert (again["content"], again["reasoning_content"]) == ("Pick B.", "weigh options")
    history = [{"role": "user", "content": "A or B?"}, *response["output"]]
    assert cc.input_to_messages(history)[1] == {
        "role": "assistant",
        "content": "Pick B.",
        "reasoning_content": "weigh options",
    }
    # and chat history -> Responses input -> chat history is stable
    messages = [{"role": "user", "content": "A or B?"}, again]
    assert cc.input_to_messages(cc.messages_to_input(messages)) == messages


def test_reasoning_output_in_content_and_history_modes() -> None:
    response = cc.chat_completion_to_response(
        chat_reply({"content": None, "reasoning_content": "think", "tool_calls": [CALL]}, "tool_calls"),
        reasoning_output="content",
    )
    reasoning, call = response["output"]
    assert reasoning["summary"] == [] and reasoning["content"] == [
        {"type": "reasoning_text", "text": "think"}
    ]
    assert call["type"] == "function_call"
    history = [
        {"role": "user", "content": "q"},
        reasoning,
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
    ]
    tool_calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}]
    turn = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    assert cc.input_to_messages(history, reasoning="reasoning")[1] == {**turn, "reasoning": "think"}
    assert cc.input_to_messages(history, reasoning="both")[1] == {
        **turn,
        "reasoning": "think",
        "reasoning_content": "think",
    }
    assert cc.input_to_messages(history, reasoning="drop")[1] == turn
    assert cc.input_to_messages(history, reasoning="think_tags")[1] == {
        **turn,
        "content": "<think>\nthink\n</think>\n\n",
    }


def test_reasoning_without_an_answer_still_reaches_the_history() -> None:
    """A turn cut off inside its reasoning leaves only a reasoning item; it is not lost."""
    response = cc.chat_completion_to_response(chat_reply({"content": "<think>long"}, "length"))
    assert [i["type"] for i in response["output"]] == ["reasoning"]
    assert response["status"] == "incomplete"
    history = [{"role": "user", "content": "q"}, *response["output"], {"role": "user", "content": "go on"}]
    assert cc.input_to_messages(history) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "long"},
        {"role": "user", "content": "go on"},
    ]


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}


def test_multi_turn_round_trip_with_tools_and_reasoning() -> None:
    """A whole agent loop: every reply converted to Responses, the history converted back."""
    replies = [
        chat_reply(
            {
                "content": "<think>need data</think>Looking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"k": 1}'}},
                    {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"k": 2}'}},
                ],
            },
            "tool_calls",
        ),
        chat_reply({"content": None, "reasoning": "one more", "tool_calls": [CALL]}, "tool_calls"),
        chat_reply({"content": "Done: 3."}),
    ]
    history: list[dict[str, Any]] = [{"role": "user", "content": "sum them"}]
    for index, reply in enumerate(replies):
        response = cc.chat_completion_to_response(reply)
        history += response["output"]
        history += [
            {"type": "function_call_output", "call_id": item["call_id"], "output": f"out{index}"}
            for item in response["output"]
            if item["type"] == "function_call"
        ]
    assert [cc.item_type(i) for i in history] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert history[8]["arguments"] == '{"x":1}'  # an object from the server becomes a JSON string
    messages = cc.input_to_messages(history, instructions="sys")
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "sum them"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "need data",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"k": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"k": 2}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out0"},
        {"role": "tool", "tool_call_id": "c2", "content": "out0"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "one more",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out1"},
        {"role": "assistant", "content": "Done: 3."},
    ]
    # the chat history survives a trip through Responses input items unchanged
    assert cc.input_to_messages(cc.messages_to_input(messages)) == messages


def test_empty_reply_still_has_an_item() -> None:
    response = cc.chat_completion_to_response(chat_reply({"content": ""}))
    assert [i["type"] for i in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["text"] == ""
    # the bare newlines some templates leave between reasoning and a call are not an answer
    calls = cc.chat_completion_to_response(
        chat_reply({"content": "\n\n", "tool_calls": [CALL]}, "tool_calls")
    )
    assert [i["type"] for i in calls["output"]] == ["function_call"]
    spaced = cc.chat_completion_to_response(chat_reply({"content": " "}))
    assert spaced["output"][0]["content"][0]["text"] == " "  # a reply that is only text is kept as is


# ------------------------------------------------------------------------------ token fields


def test_token_fields_stripped_from_history_and_attached_to_last_item() -> None:
    output = cc.chat_completion_to_response(
        chat_reply({"content": "<think>t</think>a", "tool_calls": [CALL]}, "tool_calls")
    )["output"]
    attach_token_fields(output, [1, 2], [3, 4], [-0.1, -0.2])
    assert [sorted(set(TRAINING_TOKEN_FIELDS) & set(item)) for item in output] == [
        [],
        [],
        sorted(TRAINING_TOKEN_FIELDS),
    ]
    assert output[-1]["generation_log_probs"] == [-0.1, -0.2]
    history = [{"role": "user", "content": "q"}, *output]
    stripped = strip_token_fields(history)
    assert not any(key in item for item in stripped for key in TRAINING_TOKEN_FIELDS)
    assert stripped[0] is history[0]  # untouched items are not copied
    assert TRAINING_TOKEN_FIELDS[0] in output[-1]  # the caller's items are not modified
    assert strip_token_fields("plain input") == "plain input"
    with pytest.raises(ValueError):
        attach_token_fields([], [1], [2], [0.0])


# -------------------------------------------------------------------------- request fields


def test_sampling_structured_output_and_reasoning_effort_both_ways() -> None:
    body = {
        "input": "hi",
        "seed": 7,
        "stop": ["END"],
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "chat_template_kwargs": {"enable_thinking": True},
        "parallel_tool_calls": False,
        "text": {
            "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
        },
        "reasoning": {"effort": "low"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "previous_response_id": "resp_1",
    }
    chat = cc.responses_request_to_chat(body)
    assert chat == {
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 7,
        "stop": ["END"],
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "chat_template_kwargs": {"enable_thinking": True},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
        "reasoning_effort": "low",
    }
    back = cc.chat_request_to_responses(chat)
    assert back["text"] == body["text"]
    assert back["reasoning"] == {"effort": "low"}
    assert (back["seed"], back["top_k"], back["parallel_tool_calls"]) == (7, 20, False)
    assert cc.responses_request_to_chat({"input": "x", "text": {"format": {"type": "text"}}}) == {
        "messages": [{"role": "user", "content": "x"}]
    }
    assert cc.text_format_to_chat({"format": {"type": "json_object"}}) == {"type": "json_object"}


def test_usage_details_and_echoed_request_fields() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    converted = cc.usage_from_chat(usage)
    assert converted == {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens_details": {"reasoning_tokens": 3},
    }
    assert cc.usage_to_chat(converted) == usage
    request = {
        "input": "q",
        "instructions": "sys",
        "temperature": 0.3,
        "tools": [{"type": "function", "name": "f"}],
    }
    response = cc.chat_completion_to_response(chat_reply({"content": "a"}), "m", request=request)
    assert (response["instructions"], response["temperature"], response["tools"]) == (
        "sys",
        0.3,
        request["tools"],
    )
    assert (response["tool_choice"], response["parallel_tool_calls"], response["incomplete_details"]) == (
        "auto",
        True,
        None,
    )
