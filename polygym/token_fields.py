"""Token capture's field names, and the helpers that write, strip and read them: one place.

A model server with token capture on puts one model call's training fields on the **last output
item of that call** (DESIGN §3): the ids of the whole context it saw, the ids it generated and the
sampling log-prob of each, with how those log-probs were taken, whether the prompt extended the
previous call's exact ids, and the policy version that generated it when the upstream said. Agents
send that output back as the next call's input, so the fields come back: a server strips them
before converting for its upstream (``strip_token_fields``) and a token-in/token-out server reads
the previous call's ids off them (``read_ids``, ``polygym.training.continuation``); a trainer reads
every call's fields (``polygym.training.tokens``).

Shipped model servers reach these through ``polygym`` / ``polygym.models``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_TOKEN_IDS = "prompt_token_ids"
"""The ids of the whole context the model saw for the call."""
GENERATION_TOKEN_IDS = "generation_token_ids"
"""The ids it generated; an item holding this key carries a call's fields."""
GENERATION_LOG_PROBS = "generation_log_probs"
"""The sampling log-prob of each generated id."""
TRAINING_TOKEN_FIELDS = (PROMPT_TOKEN_IDS, GENERATION_TOKEN_IDS, GENERATION_LOG_PROBS)

LOGPROB_SEMANTICS_FIELD = "generation_logprob_semantics"
"""How the call's ``generation_log_probs`` were taken: ``source`` (hf_generate, vllm, llama_cpp,
scripted), ``temperature`` and ``processed`` (``raw``: log-softmax of the model's logits;
``sampling_distribution``: after temperature/top-p/top-k, the distribution actually sampled)."""

POLICY_VERSION_FIELD = "generation_policy_version"
"""The policy version (optimizer updates applied to the weights) that generated the call, when the
upstream states it (``policy_version`` on its completion; ``polygym.training.policy_version``)."""

PROMPT_CONTINUATION_FIELD = "prompt_continuation"
"""Whether the call's prompt extended the previous call's exact token ids (``{"exact": true}``) or
was rendered anew from the history's text (``{"exact": false, "reason": ...}``); absent on a first
turn (``polygym.training.continuation``)."""

PREFIX_FIELD = "required_prefix_token_ids"
"""Chat request field carrying the previous turn's prompt + generation ids (NeMo Gym 0.7's name)."""

CALL_TOKEN_FIELDS = (
    *TRAINING_TOKEN_FIELDS,
    LOGPROB_SEMANTICS_FIELD,
    PROMPT_CONTINUATION_FIELD,
    POLICY_VERSION_FIELD,
)
"""Every field a model call's last item may carry, all stripped before a history goes upstream."""


def logprob_semantics(source: str, temperature: float | None, processed: str, **extra: Any) -> dict[str, Any]:
    """The ``LOGPROB_SEMANTICS_FIELD`` value; a trainer must compare log-probs only under equal ones."""
    return {"source": source, "temperature": temperature, "processed": processed, **extra}


def attach_token_fields(
    output: list[dict[str, Any]],
    prompt_token_ids: Sequence[int],
    generation_token_ids: Sequence[int],
    generation_log_probs: Sequence[float],
    semantics: dict[str, Any] | None = None,
    continuation: dict[str, Any] | None = None,
    policy_version: int | None = None,
) -> None:
    """Put one model call's training fields on its last output item (DESIGN §3), with ``semantics``
    (``logprob_semantics``) when the server knows how its log-probs were taken, ``continuation``
    (``PROMPT_CONTINUATION_FIELD``) when the prompt continued earlier ids, and the
    ``policy_version`` that generated it when the upstream stated one."""
    if not output:
        raise ValueError("a model call with token ids must have at least one output item")
    last = output[-1]
    last[PROMPT_TOKEN_IDS] = list(prompt_token_ids)
    last[GENERATION_TOKEN_IDS] = list(generation_token_ids)
    last[GENERATION_LOG_PROBS] = list(generation_log_probs)
    if semantics is not None:
        last[LOGPROB_SEMANTICS_FIELD] = dict(semantics)
    if continuation is not None:
        last[PROMPT_CONTINUATION_FIELD] = dict(continuation)
    if policy_version is not None:
        last[POLICY_VERSION_FIELD] = policy_version


def strip_token_fields(items: Any) -> Any:
    """``items`` without the training token fields agents send back on earlier model output.

    Works on Responses input items and Chat messages alike; items without such fields are reused,
    not copied. A string input is returned as is.
    """
    if not isinstance(items, list):
        return items
    stripped = []
    for item in items:
        if isinstance(item, dict) and any(key in item for key in CALL_TOKEN_FIELDS):
            item = {k: v for k, v in item.items() if k not in CALL_TOKEN_FIELDS}
        stripped.append(item)
    return stripped


def carries_tokens(item: Any) -> bool:
    """Whether ``item`` is the last item of a model call with token capture on."""
    return isinstance(item, dict) and GENERATION_TOKEN_IDS in item


def read_ids(item: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The call's prompt and generation ids; TypeError/ValueError when they are not integers."""
    prompt = [int(t) for t in item.get(PROMPT_TOKEN_IDS) or []]
    return prompt, [int(t) for t in item.get(GENERATION_TOKEN_IDS) or []]


def read_log_probs(item: dict[str, Any]) -> list[float]:
    """The call's generation log-probs; TypeError/ValueError when they are not numbers."""
    return [float(x) for x in item.get(GENERATION_LOG_PROBS) or []]


def read_stamp(item: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The object field ``name`` (``LOGPROB_SEMANTICS_FIELD``, ``PROMPT_CONTINUATION_FIELD``) when
    the server stamped one; None when absent or not an object."""
    value = item.get(name)
    return value if isinstance(value, dict) else None
