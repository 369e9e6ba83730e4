"""Token-in/token-out multi-turn: turn k's prompt is turn k-1's exact ids plus the new messages' tokens.

A multi-turn rollout is trained as one sequence (``tokens.assemble``), which is only on-policy if
every turn's prompt starts with the previous turn's prompt and generation, token for token. A model
server that re-renders the whole history through the chat template breaks that whenever the
rendered history differs from what was generated: a compact-JSON tool call that the Qwen2.5
template re-serializes with spaces, reasoning that a thinking model's template drops, a sampled
token pair that merges on re-tokenization. Such a rollout can only be masked whole, which biases
training against exactly those episodes. So the prompt is built from ids instead of text:

    prompt_k = prompt_{k-1} + generation_{k-1} + suffix(new messages)

**Where the ids come from.** The agent sends the episode's output back as the next call's input,
and the last item of every model call carries its ``prompt_token_ids`` and
``generation_token_ids`` (DESIGN §3); ``parent_ids`` reads them off the last such item. Nothing
is cached per session, so replicas, restarts and resumed runs need no shared state. A model server
that forwards to a backend sends them as ``required_prefix_token_ids`` (NeMo Gym 0.7's name for
the same extension); the backend answers with the ``prompt_token_ids`` it really used.

**The suffix.** ``full`` is the template's rendering of all messages with the generation prompt;
``probe`` that of the messages up to and including the last assistant message followed by a user
message holding a sentinel (a real follow-up, so no template treats the assistant message as one
to continue). The text of ``probe`` up to the last stop text (``<|im_end|>``: the end of the
assistant turn) before the sentinel is the history as far as the generation reached; ``full`` must
start with it (a template that renders earlier turns differently once later messages exist has no
clean suffix), and the rest of ``full``, after that stop text, is what the new messages add. The
suffix is that rest with the stop text in front, tokenized on its own (no BOS); its first token is
dropped when the generation already ended with it, so a generation cut off by the token limit gets
the turn's end marker appended, as the template would show it.

**Fallback, counted.** When a check fails (no clean suffix, no assistant turn to continue, an
assistant item after the last generated one), the server renders the whole history as before and
says so on the call's last output item (``PROMPT_CONTINUATION_FIELD``: ``{"exact": false,
"reason": ...}``); ``tokens.assemble`` counts such turns (``retemplated_turns``) and masks the
rollout only if the re-rendered prompt really drifted.

The history before the carrying item is trusted to be the one those ids were generated from: an
agent that rewrites earlier turns (summarizes, truncates) must drop the token fields it sends back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polygym.dialects.chat import item_type
from polygym.token_fields import PREFIX_FIELD, carries_tokens, read_ids

SENTINEL = "\u2063polygym-probe\u2063"
"""User content marking where the template starts the turn after the generated one: text no one writes."""

_MODEL_ITEMS = frozenset({"function_call", "reasoning"})


class NoCleanSuffix(ValueError):
    """The new messages cannot be rendered as a pure suffix of the history; the message says why."""


@dataclass(frozen=True)
class Continuation:
    """How one call's prompt was built: ``prompt_ids`` from exact ids, or None with ``reason``."""

    prompt_ids: list[int] | None
    reason: str | None = None

    def stamp(self) -> dict[str, Any]:
        """The ``PROMPT_CONTINUATION_FIELD`` value a server puts on the call's output."""
        if self.prompt_ids is not None:
            return {"exact": True}
        return {"exact": False, "reason": self.reason}


def _is_model_item(item: dict[str, Any]) -> bool:
    kind = item_type(item)
    return kind in _MODEL_ITEMS or (kind == "message" and item.get("role") == "assistant")


def parent_ids(items: Sequence[Any]) -> tuple[list[int] | None, str | None]:
    """``(prompt + generation ids of the history's last model call, None)``; ``(None, reason)`` when
    the history holds model output that cannot be continued; ``(None, None)`` on a first turn."""
    carrier = None
    for index, item in enumerate(items):
        if carries_tokens(item):
            carrier = index
    model_output = [i for i, item in enumerate(items) if isinstance(item, dict) and _is_model_item(item)]
    if carrier is None:
        return None, ("the history's model output carries no token ids" if model_output else None)
    if model_output and model_output[-1] > carrier:
        return None, "assistant items follow the last generated turn"
    try:
        prompt, generation = read_ids(items[carrier])
    except (TypeError, ValueError):
        return None, "the history's token ids are not integers"
    return prompt + generation, None


def check_prefix(value: Any, vocab_size: int, max_tokens: int) -> list[int]:
    """``required_prefix_token_ids`` as sent by a caller: a list of ids of this vocabulary; raises
    ValueError naming the problem (a caller's bad ids must not reach the model)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{PREFIX_FIELD} must be a non-empty list of token ids")
    if len(value) > max_tokens:
        raise ValueError(f"{PREFIX_FIELD} has {len(value)} ids, more than the {max_tokens} allowed")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in value):
        raise ValueError(f"{PREFIX_FIELD} must hold integer ids in 0..{vocab_size - 1}")
    return list(value)


def last_turn_end(messages: Sequence[dict[str, Any]]) -> int:
    """Index just past the last assistant message (the prefix's end); NoCleanSuffix without one."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index + 1
    raise NoCleanSuffix("the messages hold no assistant turn to continue")


def probe_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages through the last assistant turn, then a user message holding ``SENTINEL``."""
    return [*messages[: last_turn_end(messages)], {"role": "user", "content": SENTINEL}]


def suffix_text(full: str, probe: str, stop_text: str) -> str:
    """The text the new messages add after the generated turn, led by ``stop_text`` (see the module
    docstring); NoCleanSuffix when there is none."""
    head = probe[: probe.find(SENTINEL)] if SENTINEL in probe else None
    if head is None:
        raise NoCleanSuffix("the chat template does not render a user message's content as given")
    close = head.rfind(stop_text) if stop_text else -1
    if close < 0:
        raise NoCleanSuffix(f"the chat template does not end an assistant turn with {stop_text!r}")
    before = head[: close + len(stop_text)]
    if not full.startswith(before):
        raise NoCleanSuffix("the template renders earlier turns differently once new messages follow")
    return stop_text + full[len(before) :]


def join(prefix: list[int], suffix: list[int]) -> list[int]:
    """``prefix + suffix``, without repeating the end-of-turn token the generation already ended with."""
    if prefix and suffix and prefix[-1] == suffix[0]:
        suffix = suffix[1:]
    return [*prefix, *suffix]
