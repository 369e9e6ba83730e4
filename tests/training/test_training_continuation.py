"""Token-in/token-out multi-turn (``polygym.training.continuation``) through the generation server.

The policy is the tiny in-code model with a Qwen2.5-style tool template (written here): the
template re-serializes a tool call's arguments with ``tojson`` (``{"city": "Oslo"}``), so a model
that writes compact JSON (``{"city":"Oslo"}``) no longer matches its own history once it is
re-rendered. Generation itself is scripted (the random model would not call a tool), everything
else is real: templating, tokenizing, vllm_model, simple_agent, the environment, the collector.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from polygym.blend.spec import parse_spec
from polygym.training.collector import TokenCollector, TokenStep
from polygym.training.continuation import (
    PREFIX_FIELD,
    SENTINEL,
    NoCleanSuffix,
    check_prefix,
    join,
    parent_ids,
    probe_messages,
    suffix_text,
)
from polygym.training.generation_server import (
    GenerationResult,
    GenerationServerThread,
    HFGenerator,
)
from polygym.training.models import tiny_policy
from polygym.training.run import stack_config
from tests.conftest import ROOT

TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are helpful.' }}{%- endif %}"
    "{{- '\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'
ANSWER = "Sunny in Oslo."
LOGPROB = -0.25
DATA = ROOT / "resources_servers/example_single_tool_call/data/example.jsonl"


class ScriptedGenerator(HFGenerator):
    """The tiny model's generator with scripted output: a compact-JSON tool call, then an answer
    once the prompt holds a tool response."""

    def __init__(self) -> None:
        model, tokenizer = tiny_policy()
        tokenizer.chat_template = TOOL_TEMPLATE
        super().__init__(model, tokenizer, batch_window_s=0.0)
        self.prompts: list[list[int]] = []

    def generate(self, requests: Any) -> list[GenerationResult]:
        results = []
        for request in requests:
            self.prompts.append(list(request.prompt_ids))
            text = ANSWER if "<tool_response>" in self.tokenizer.decode(request.prompt_ids) else CALL
            ids = [*self.encode(text), self.stop_ids[0]]
            results.append(GenerationResult(ids, [LOGPROB] * len(ids), "stop"))
        return results


def text(generator: HFGenerator, ids: list[int]) -> str:
    return str(generator.tokenizer.decode(ids))


# -- the pieces -------------------------------------------------------------------------------------


def test_suffix_is_what_the_new_messages_add_after_the_generated_turn() -> None:
    history = "<u>U<e>\n<a>call<e>\n"
    probe = history + f"<u>{SENTINEL}<e>\n<a>"
    assert suffix_text(history + "<t>out<e>\n<a>", probe, "<e>") == "<e>\n<t>out<e>\n<a>"
    with pytest.raises(NoCleanSuffix, match="renders earlier turns differently"):
        suffix_text("<u>U<e>\n<a>call <e>\n<t>out<e>\n<a>", probe, "<e>")
    with pytest.raises(NoCleanSuffix, match="does not end an assistant turn with '<end>'"):
        suffix_text(history + "<t>out<e>\n<a>", probe, "<end>")
    with pytest.raises(NoCleanSuffix, match="user message's content"):
        suffix_text(history, history, "<e>")
    messages = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "call"}, {"role": "tool"}]
    assert probe_messages(messages) == [*messages[:2], {"role": "user", "content": SENTINEL}]
    with pytest.raises(NoCleanSuffix, match="no assistant turn"):
        probe_messages(messages[:1])


def test_join_does_not_repeat_the_stop_token_the_generation_ended_with() -> None:
    assert join([1, 2, 9], [9, 5, 6]) == [1, 2, 9, 5, 6]
    assert join([1, 2, 3], [9, 5, 6]) == [1, 2, 3, 9, 5, 6]  # cut off: the turn's end is appended


def test_parent_ids_come_from_the_last_token_carrying_item() -> None:
    history = [
        {"role": "user", "content": "hi"},
        {
            "type": "function_call",
            "name": "f",
            "arguments": "{}",
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3],
        },
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    assert parent_ids(history) == ([1, 2, 3], None)
    assert parent_ids(history[:1]) == (None, None)
    untokened = [history[0], {"role": "assistant", "content": "ok"}]
    assert parent_ids(untokened)[1] == "the history's model output carries no token ids"
    assert parent_ids([*history, {"role": "assistant", "content": "prefilled"}])[1] == (
        "assistant items follow the last generated turn"
    )


def test_prefix_ids_are_checked_against_the_vocabulary() -> None:
    assert check_prefix([0, 5], 10, 100) == [0, 5]
    for bad in ([], [10], [True], "1,2", [1] * 101):
        with pytest.raises(ValueError, match=PREFIX_FIELD):
            check_prefix(bad, 10, 100)


# -- the generation server ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_generation_server_extends_the_exact_ids_of_a_compact_json_tool_call() -> None:
    generator = ScriptedGenerator()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"}]
    first = await generator.chat_completion(
        {"messages": messages, "tools": tools, "return_token_ids": True}, "p"
    )
    call = first["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"city":"Oslo"}'
    parent = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    body = {"messages": history, "tools": tools, "return_token_ids": True}
    retemplated = await generator.chat_completion(body, "p")
    assert retemplated["prompt_token_ids"][: len(parent)] != parent  # today's drift
    assert '"arguments": {"city": "Oslo"}' in text(generator, retemplated["prompt_token_ids"])
    exact = await generator.chat_completion({**body, PREFIX_FIELD: parent}, "p")
    assert exact["prompt_continuation"] == {"exact": True}
    prompt = exact["prompt_token_ids"]
    assert prompt[: len(parent)] == parent
    assert text(generator, prompt[len(parent) :]) == (
        "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert generator.prompts[-1] == prompt  # what the model was given is what is returned


@pytest.mark.asyncio
async def test_generation_server_falls_back_and_says_why() -> None:
    generator = ScriptedGenerator()
    body = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True, PREFIX_FIELD: [1, 2]}
    reply = await generator.chat_completion(body, "p")
    assert reply["prompt_continuation"] == {
        "exact": False,
        "reason": "the messages hold no assistant turn to continue",
    }
    assert reply["prompt_token_ids"] == generator.prompt_ids(body["messages"])


THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and not loop.last %}"
    "{%- set content = content.split('</think>')[-1].lstrip() %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


async def test_a_thinking_models_dropped_reasoning_stays_in_its_context() -> None:
    """Like Qwen3's template, this one drops earlier turns' reasoning: re-rendered, every later turn
    of a thinking model would drift; continued from ids, the model keeps reading what it thought."""
    generator = ScriptedGenerator()
    generator.tokenizer.chat_template = THINKING_TEMPLATE
    generator.generate = lambda requests: [  # type: ignore[method-assign]
        GenerationResult(ids, [LOGPROB] * len(ids), "stop")
        for ids in [[*generator.encode("<think>plan</think> guess 3"), generator.stop_ids[0]]] * len(requests)
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess."}]
    first = await generator.chat_completion({"messages": messages, "return_token_ids": True}, "p")
    parent = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    said = first["choices"][0]["message"]["content"]
    history = [*messages, {"role": "assistant", "content": said}, {"role": "user", "content": "Too low."}]
    body = {"messages": history, "return_token_ids": True}
    assert (await generator.chat_completion(body, "p"))["prompt_token_ids"][: len(parent)] != parent
    exact = await generator.chat_completion({**body, PREFIX_FIELD: parent}, "p")
    assert exact["prompt_continuation"] == {"exact": True}
    assert exact["prompt_token_ids"][: len(parent)] == parent
    assert "<think>plan</think>" in text(generator, exact["prompt_token_ids"])


# -- end to end: agent, environment, vllm_model, generation server, collector ------------------------------


def collect(tmp_path: Path, supply: bool, **collector: Any) -> tuple[TokenStep, ScriptedGenerator]:
    spec = parse_spec(
        {
            "environments": [{"name": "example_single_tool_call", "train": [str(DATA)]}],
            "prompts_per_step": 2,
            "responses_per_prompt": 2,
        },
        "test",
        tmp_path,
    )
    generator = ScriptedGenerator()
    with GenerationServerThread(generator) as server:
        override = (
            f"policy_model.responses_api_models.vllm_model.supply_prefix_token_ids={str(supply).lower()}"
        )
        config = stack_config(spec, server.url, (), [override])
        with TokenCollector(spec, tmp_path / "rollouts.jsonl", stack_config=config, **collector) as tokens:
            return tokens.step(), generator


def test_compact_json_tool_episode_is_trained_with_exact_ids(tmp_path: Path) -> None:
    step, generator = collect(tmp_path, supply=True)
    assert len(step.rollouts) == 4
    for rollout in step.rollouts:
        assert rollout.num_turns == 2 and rollout.contiguous and not rollout.masked, rollout.problem
        assert rollout.retemplated_turns == 0
        generated = [t for t, m in zip(rollout.input_ids, rollout.loss_mask, strict=True) if m]
        eos = generator.stop_ids[0]
        assert generated == [*generator.encode(CALL), eos, *generator.encode(ANSWER), eos]
        assert [lp for lp, m in zip(rollout.logprobs, rollout.loss_mask, strict=True) if m] == [
            LOGPROB
        ] * len(generated)
        # the whole sequence is exactly the last prompt the model saw, plus its answer
        assert rollout.input_ids[: -len(generator.encode(ANSWER)) - 1] in generator.prompts
    stats = step.stats["example_single_tool_call"]
    assert stats.masked == 0 and stats.masked_share == 0.0 and stats.retemplated_turns == 0
    assert step.metrics()["polygym/example_single_tool_call/masked_share"] == 0.0


def test_without_token_continuation_the_episode_is_masked_and_the_alarm_rings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="polygym.training"):
        step, _ = collect(tmp_path, supply=False, max_masked_share=0.5)
    assert all(r.masked and not r.contiguous for r in step.rollouts)
    assert all(r.retemplated_turns == 1 for r in step.rollouts)
    stats = step.stats["example_single_tool_call"]
    assert stats.masked_share == 1.0 and stats.masked_alarm == 1 and step.total.masked_alarm == 1
    metrics = step.metrics()
    assert metrics["polygym/example_single_tool_call/masked_share"] == 1.0
    assert metrics["polygym/example_single_tool_call/masked_alarm"] == 1.0
    assert "example_single_tool_call has 4 of 4 rollouts masked" in caplog.text
    assert "max_masked_share 50%" in caplog.text
