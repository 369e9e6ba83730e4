"""The per-rollout performance record, ``ng_perf``, under NeMo Gym 0.7's key names.

NeMo Gym's collector stamps each rollout with a small ``ng_perf`` dict, and its
``/aggregate_metrics`` turns the records of a batch into a ``perf_summary`` (latency percentiles,
turns, tokens per turn). Writing the same record makes polygym's output files read the same in
NeMo Gym's tools, and lets a NeMo Gym agent's ``/aggregate_metrics`` summarise a polygym run.

The record is built from what the collector already holds, with no second parse of any body: the
wall-clock of the agent's ``/run`` and the rollout's ``response`` (its output items and its
``usage``, which polygym's and NeMo Gym's agents sum over the rollout's model calls). A key is
written only when its value is known, never as null or as a guessed 0, as NeMo Gym does:

- ``total_latency_ms``: always (the ``/run`` call's wall-clock, retries included);
- ``num_turns``, ``num_tool_calls``, ``token_observability_coverage``: when the output holds
  items the model wrote (a turn is one model call's run of items, as ``gym eval health-check``
  counts them); the coverage is 1.0 when ``usage`` counts tokens, else 0.0;
- ``prompt_tokens``, ``completion_tokens``: when ``usage`` counts any token;
- ``cached_prompt_tokens``, ``reasoning_tokens``: only when more than 0, since polygym fills the
  usage detail objects NeMo Gym's verifiers require with zeros when a model did not report them,
  so a 0 there cannot tell "none" from "not reported".
"""

from __future__ import annotations

from typing import Any

from polygym.collect.health import model_turns
from polygym.row import NG_PERF


def _count(value: Any) -> int | None:
    """``value`` when it is a token count (an int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _detail(usage: dict[str, Any], details: str, key: str) -> int | None:
    given = usage.get(details)
    return _count(given.get(key)) if isinstance(given, dict) else None


def token_counts(usage: Any) -> dict[str, int]:
    """The record's token keys from a Responses ``usage``; empty when it counts no token."""
    if not isinstance(usage, dict):
        return {}
    prompt, completion = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    if not (prompt or completion):
        return {}
    counts = {"prompt_tokens": prompt or 0, "completion_tokens": completion or 0}
    cached = _detail(usage, "input_tokens_details", "cached_tokens")
    reasoning = _detail(usage, "output_tokens_details", "reasoning_tokens")
    if cached:
        counts["cached_prompt_tokens"] = cached
    if reasoning:
        counts["reasoning_tokens"] = reasoning
    return counts


def perf_record(rollout: dict[str, Any], latency_s: float) -> dict[str, Any]:
    """The ``ng_perf`` record of one rollout whose ``/run`` took ``latency_s`` seconds."""
    record: dict[str, Any] = {"total_latency_ms": round(latency_s * 1000.0, 3)}
    response = rollout.get("response")
    if not isinstance(response, dict):
        return record
    tokens = token_counts(response.get("usage"))
    output = response.get("output")
    items = [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []
    turns = sum(1 for _ in model_turns(items))
    if turns:
        record["num_turns"] = turns
        record["num_tool_calls"] = sum(1 for item in items if item.get("type") == "function_call")
        record["token_observability_coverage"] = 1.0 if tokens else 0.0
    record.update(tokens)
    return record


def with_perf_record(rollout: Any, latency_s: float) -> Any:
    """``rollout`` with its ``ng_perf`` record added (a reply that is no rollout left as it is).

    The collector owns the key, as NeMo Gym's does: a record the agent sent is replaced."""
    if isinstance(rollout, dict):
        rollout[NG_PERF] = perf_record(rollout, latency_s)
    return rollout
