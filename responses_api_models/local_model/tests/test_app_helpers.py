"""local_model's request handling that needs no model: config, episodes, messages, tool choice."""

from __future__ import annotations

import pytest

from polygym import HTTPError
from responses_api_models.local_model.app import Config, episode_of, prepare_messages, tool_mode
from responses_api_models.local_model.tool_calls import function_tools


def test_config_rejects_unknown_model() -> None:
    with pytest.raises(ValueError, match="not a known model"):
        Config.model_validate({"model": "gpt-17"})
    assert Config.model_validate({"model": "mine", "model_path": "/x.gguf"}).model == "mine"


def test_episode_counts_rounds_and_calls_since_the_last_user_message() -> None:
    call = {"type": "function_call", "name": "f", "arguments": '{"a": 1}', "call_id": "1"}
    out = {"type": "function_call_output", "call_id": "1", "output": "x"}
    items = [{"role": "user", "content": "old"}, call, out, {"role": "user", "content": "new"}, call, out]
    items += [call | {"arguments": '{"a": 2}'}, call | {"arguments": '{"a": 3}'}, out, out]
    episode = episode_of(items)
    assert episode.tool_rounds == 2
    assert len(episode.call_keys) == 3


def test_prepare_messages_maps_developer_and_merges_system() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": "hi"},
    ]
    assert prepare_messages(messages, "") == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "hi"},
    ]
    assert prepare_messages([{"role": "user", "content": "hi"}], "Hint.")[0] == {
        "role": "system",
        "content": "Hint.",
    }


def test_tool_mode() -> None:
    tools = function_tools([{"type": "function", "name": "a"}, {"type": "function", "name": "b"}])
    auto = tool_mode("auto", tools)
    assert (len(auto.tools), auto.allow_calls, auto.allow_answer) == (2, True, True)
    assert (tool_mode("none", tools).allow_calls, tool_mode("none", tools).allow_answer) == (False, True)
    assert tool_mode("required", tools).allow_answer is False
    named = tool_mode({"type": "function", "name": "b"}, tools)
    assert [t["name"] for t in named.tools] == ["b"] and named.allow_answer is False
    allowed = tool_mode({"type": "allowed_tools", "mode": "auto", "tools": [{"name": "a"}]}, tools)
    assert [t["name"] for t in allowed.tools] == ["a"] and allowed.allow_answer is True
    assert tool_mode(None, []).allow_calls is False
    with pytest.raises(HTTPError, match="not in tools"):
        tool_mode({"type": "function", "name": "zzz"}, tools)
    with pytest.raises(HTTPError, match="unsupported tool_choice"):
        tool_mode("sometimes", tools)
