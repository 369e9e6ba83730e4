"""ng_perf: NeMo Gym 0.7's per-rollout performance record, only the keys polygym knows."""

from __future__ import annotations

from typing import Any

from polygym.collect.perf_record import perf_record, with_perf_record
from polygym.protocol import complete_response, function_call_item, function_call_output_item, message_item
from polygym.row import NG_PERF

NEMO_GYM_PERF_KEYS = {
    "num_turns",
    "num_tool_calls",
    "token_observability_coverage",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "total_latency_ms",
}
"""Every key NeMo Gym 0.7's collector may write in ``ng_perf`` (and its ``compute_perf_summary`` reads)."""


def rollout(output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    """A verified rollout as an agent returns it: the response completed as verifiers require."""
    response = complete_response({"output": output, **({"usage": usage} if usage is not None else {})})
    return {"response": response, "reward": 1.0}


TOOL_LOOP = [
    function_call_item("get_weather", '{"city": "Paris"}'),
    function_call_output_item("c1", "sunny"),
    function_call_item("get_weather", '{"city": "Rome"}'),
    function_call_output_item("c2", "rain"),
    message_item("Paris is sunny."),
]


def test_a_tool_loop_gives_turns_tool_calls_tokens_and_latency() -> None:
    usage = {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}
    record = perf_record(rollout(TOOL_LOOP, usage), 1.2345678)
    assert record == {
        "total_latency_ms": 1234.568,
        "num_turns": 3,
        "num_tool_calls": 2,
        "token_observability_coverage": 1.0,
        "prompt_tokens": 120,
        "completion_tokens": 30,
    }
    assert set(record) <= NEMO_GYM_PERF_KEYS
    assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in record.values())


def test_zero_filled_usage_details_are_left_out_and_reported_ones_kept() -> None:
    """polygym fills missing detail counts with 0 for NeMo Gym's verifiers: 0 there is not a count."""
    reported = {
        "input_tokens": 100,
        "output_tokens": 50,
        "input_tokens_details": {"cached_tokens": 64},
        "output_tokens_details": {"reasoning_tokens": 20},
    }
    record = perf_record(rollout([message_item("hi")], reported), 0.5)
    assert record["cached_prompt_tokens"] == 64 and record["reasoning_tokens"] == 20
    zeros = perf_record(rollout([message_item("hi")], {"input_tokens": 100, "output_tokens": 5}), 0.5)
    assert "cached_prompt_tokens" not in zeros and "reasoning_tokens" not in zeros


def test_unknown_values_are_absent_not_null() -> None:
    """No usage counted: tokens absent and coverage 0.0; no model item: no turn counts at all."""
    no_usage = perf_record(rollout([message_item("hi")], None), 0.25)
    assert no_usage == {
        "total_latency_ms": 250.0,
        "num_turns": 1,
        "num_tool_calls": 0,
        "token_observability_coverage": 0.0,
    }
    assert perf_record({"reward": 0.0}, 0.001) == {"total_latency_ms": 1.0}
    empty = perf_record(rollout([], {"input_tokens": 10, "output_tokens": 0}), 0.1)
    assert empty == {"total_latency_ms": 100.0, "prompt_tokens": 10, "completion_tokens": 0}
    assert None not in {*no_usage.values(), *empty.values()}


def test_the_collector_owns_the_key_and_leaves_non_rollouts_alone() -> None:
    given = {**rollout([message_item("hi")], None), NG_PERF: {"num_turns": 99}}
    assert with_perf_record(given, 0.2)[NG_PERF]["num_turns"] == 1
    assert with_perf_record(["not", "a", "rollout"], 0.2) == ["not", "a", "rollout"]
