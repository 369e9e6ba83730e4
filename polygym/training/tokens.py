"""Token-level rollouts: what an RL trainer needs from one episode, read off its output items.

A model server with token capture on puts three fields (``polygym.token_fields``) on the **last
output item of every model call** (DESIGN §3): ``prompt_token_ids`` (the whole context the model
saw for that call), ``generation_token_ids`` (what it generated) and ``generation_log_probs``
(the sampling log-prob of each generated token). An episode of ``n`` model calls therefore carries
``n`` such triples, in order, among its ``response.output`` items.

``assemble`` turns them into one training sequence::

    input_ids = prompt_0 + gen_0 + env_1 + gen_1 + ... + env_{n-1} + gen_{n-1}

where ``env_k`` is what call ``k``'s prompt adds after call ``k-1``'s prompt and generation (tool
outputs, observations, the chat template's turn markers). ``loss_mask`` is 1 on every ``gen_k``
token and 0 elsewhere; ``logprobs`` holds the sampling log-prob of every ``gen_k`` token and 0.0
elsewhere; ``prompt_length`` is ``len(prompt_0)`` (a trainer that splits "prompt" from
"completion" takes ``input_ids[:prompt_length]`` and the rest).

**Contiguity.** That sequence is only what the policy actually saw if every call's prompt starts
with the previous call's prompt followed by its generation, token for token. Model servers rebuild
each prompt from text (the chat template re-tokenizes the history), so a generation whose text
re-tokenizes differently (a rare merge of two sampled tokens, whitespace the template strips, a
reasoning block the template drops) silently changes the context: training on the assembled
sequence would then be off-policy without anyone noticing. Token-in/token-out multi-turn
(``polygym.training.continuation``) avoids that: the server extends the previous call's exact ids
and stamps the call ``prompt_continuation: {"exact": true}``; calls rendered anew are counted
(``retemplated_turns``). ``assemble`` still checks every turn; a rollout
that breaks the rule is returned with ``contiguous=False``, a ``problem`` saying where, and an
all-zero ``loss_mask`` (``masked=True``), so it contributes nothing to the loss while its reward is
still reported. Rollouts with no token fields at all (token capture off, or an episode that ended
before any model call) and rollouts whose ids and log-probs disagree are masked the same way.

**Log-prob semantics.** A server states how it took each call's log-probs
(``generation_logprob_semantics``: source, temperature, raw or after sampling processing); the
rollout keeps it (``logprob_semantics``), and one whose calls disagree is masked: its log-probs
are not one distribution's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from polygym.row import ENV_FIELD, ROLLOUT_INDEX, STEP_FIELD, TASK_INDEX, reward
from polygym.token_fields import (
    LOGPROB_SEMANTICS_FIELD,
    PROMPT_CONTINUATION_FIELD,
    carries_tokens,
    read_ids,
    read_log_probs,
    read_stamp,
)

_NOT_COMPONENTS = frozenset({"reward", "responses_create_params", "response", "agent_ref"})


@dataclass(frozen=True)
class ModelCall:
    """The training token fields of one model call."""

    prompt_ids: list[int]
    generation_ids: list[int]
    log_probs: list[float]
    item_index: int
    """Index in ``response.output`` of the item that carried the fields."""
    semantics: dict[str, Any] | None = None
    """How the model server took the log-probs (``LOGPROB_SEMANTICS_FIELD``), when it said."""
    continuation: dict[str, Any] | None = None
    """Whether the prompt extended the previous call's exact ids (``PROMPT_CONTINUATION_FIELD``)."""

    @property
    def exact_continuation(self) -> bool:
        return isinstance(self.continuation, dict) and self.continuation.get("exact") is True


@dataclass
class TokenRollout:
    """One episode as a trainer consumes it (see the module docstring for the layout)."""

    env: str
    group_id: int
    """Prompt group: the rollout's task index (all responses to one prompt share it)."""
    rollout_index: int
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    reward: float
    reward_components: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    """Model calls in the episode."""
    truncated: bool = False
    """The episode was cut short (token limit, context length, the agent's step limit), or one of
    its model calls was (``truncated_turns > 0``)."""
    truncated_turns: int = 0
    """Model calls that stopped at the row's ``max_output_tokens``: in a multi-turn game every turn
    can be cut while the episode itself still ends ``completed``."""
    retemplated_turns: int = 0
    """Calls after the first whose prompt was rendered anew from the history's text instead of
    extending the previous call's ids (token-in/token-out off, or no clean suffix:
    ``polygym.training.continuation``); each may drift, which masks the rollout."""
    contiguous: bool = True
    masked: bool = False
    """True when ``loss_mask`` was zeroed because the rollout cannot be trained on as is."""
    problem: str | None = None
    step: int | None = None
    logprob_semantics: dict[str, Any] | None = None
    """How the rollout's log-probs were taken (source, temperature, processing), as its model
    server stamped them; None when the server did not say."""
    policy_version: int | None = None
    """The version of the weights that generated it (oldest call), set by the collector
    (``policy_version.check_staleness``); None: unknown."""
    staleness: int | None = None
    """Steps between the generating version and the version that trains on it."""
    stale: bool = False
    """Over the collector's ``max_staleness`` (or of unknown version under a bound)."""

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def completion_ids(self) -> list[int]:
        return self.input_ids[self.prompt_length :]

    @property
    def completion_mask(self) -> list[int]:
        return self.loss_mask[self.prompt_length :]

    @property
    def completion_logprobs(self) -> list[float]:
        return self.logprobs[self.prompt_length :]


def model_calls(output: Iterable[Any]) -> list[ModelCall]:
    """The token fields of every model call in ``output``, in order (items without them skipped)."""
    calls = []
    for index, item in enumerate(output):
        if not carries_tokens(item):
            continue
        prompt_ids, generation_ids = read_ids(item)
        calls.append(
            ModelCall(
                prompt_ids=prompt_ids,
                generation_ids=generation_ids,
                log_probs=read_log_probs(item),
                item_index=index,
                semantics=read_stamp(item, LOGPROB_SEMANTICS_FIELD),
                continuation=read_stamp(item, PROMPT_CONTINUATION_FIELD),
            )
        )
    return calls


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def reward_components(rollout: dict[str, Any], input_keys: Iterable[str] = ()) -> dict[str, float]:
    """Numeric fields the verifier added besides ``reward`` (a verifier that scores several things).

    Fields of the dataset row (``input_keys``), polygym's own ``_``-prefixed fields and booleans
    are left out.
    """
    skip = set(input_keys) | _NOT_COMPONENTS
    return {
        key: float(value)
        for key, value in rollout.items()
        if key not in skip
        and not key.startswith("_")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def is_truncated(rollout: dict[str, Any]) -> bool:
    """True when the episode's response says it was cut short (``status: incomplete``)."""
    response = rollout.get("response")
    return isinstance(response, dict) and response.get("status") == "incomplete"


def output_token_limit(rollout: dict[str, Any]) -> int | None:
    """The per-call generation limit the rollout was sampled with (``max_output_tokens``), if any."""
    params = rollout.get("responses_create_params")
    limit = params.get("max_output_tokens") if isinstance(params, dict) else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def truncated_turns(calls: list[ModelCall], limit: int | None) -> int:
    """Calls whose generation reached ``limit`` tokens (one that ended on its stop token exactly at
    the limit counts too: the ids alone cannot tell the two apart)."""
    return 0 if limit is None else sum(len(call.generation_ids) >= limit for call in calls)


def assemble(rollout: dict[str, Any], env: str | None = None, input_keys: Iterable[str] = ()) -> TokenRollout:
    """The token rollout of one verified rollout row (as ``collect`` returns or ``X.jsonl`` holds).

    ``env`` defaults to the row's ``_pg_env`` (set by step-wise collection), else its agent name.
    Never raises on a bad or untrainable rollout: it comes back masked, with ``problem`` set.
    """
    response = rollout.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    calls = model_calls(output if isinstance(output, list) else [])
    ref = rollout.get("agent_ref")
    agent = ref.get("name") if isinstance(ref, dict) else None
    cut_turns = truncated_turns(calls, output_token_limit(rollout))
    base = TokenRollout(
        env=str(env or rollout.get(ENV_FIELD) or agent or "?"),
        group_id=int(rollout.get(TASK_INDEX, 0)),
        rollout_index=int(rollout.get(ROLLOUT_INDEX, 0)),
        input_ids=[],
        loss_mask=[],
        logprobs=[],
        prompt_length=0,
        reward=reward(rollout),
        reward_components=reward_components(rollout, input_keys),
        num_turns=len(calls),
        retemplated_turns=sum(not call.exact_continuation for call in calls[1:]),
        truncated=is_truncated(rollout) or cut_turns > 0,
        truncated_turns=cut_turns,
        step=rollout.get(STEP_FIELD) if isinstance(rollout.get(STEP_FIELD), int) else None,
    )
    if not calls:
        base.masked = True
        base.problem = "no model call carries token ids (is token capture on?)"
        return base
    base.logprob_semantics = calls[0].semantics
    ids: list[int] = list(calls[0].prompt_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    for turn, call in enumerate(calls):
        if len(call.log_probs) != len(call.generation_ids):
            return _masked(
                base,
                call,
                f"turn {turn}: {len(call.generation_ids)} generated ids but {len(call.log_probs)} log-probs",
            )
        if call.semantics != base.logprob_semantics:
            return _masked(
                base,
                call,
                f"turn {turn}: log-probs taken as {call.semantics}, turn 0's as {base.logprob_semantics}",
            )
        if turn > 0:
            if call.prompt_ids[: len(ids)] != ids:
                at = _first_difference(call.prompt_ids, ids)
                reason = (call.continuation or {}).get("reason")
                return _masked(
                    base,
                    call,
                    f"turn {turn}: the prompt does not extend turn {turn - 1}'s prompt + generation "
                    f"(first difference at token {at} of {len(ids)}; retokenized history"
                    + (f": {reason}" if reason else "")
                    + ")",
                    contiguous=False,
                )
            added = call.prompt_ids[len(ids) :]
            ids += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
        ids += call.generation_ids
        mask += [1] * len(call.generation_ids)
        logprobs += call.log_probs
    base.input_ids, base.loss_mask, base.logprobs = ids, mask, logprobs
    base.prompt_length = len(calls[0].prompt_ids)
    return base


def _masked(base: TokenRollout, call: ModelCall, problem: str, contiguous: bool = True) -> TokenRollout:
    """``base`` flagged: the failing call's own context and generation, nothing trainable."""
    base.input_ids = [*call.prompt_ids, *call.generation_ids]
    base.loss_mask = [0] * len(base.input_ids)
    base.logprobs = [0.0] * len(base.input_ids)
    base.prompt_length = len(call.prompt_ids)
    base.contiguous = contiguous
    base.masked = True
    base.problem = problem
    return base
