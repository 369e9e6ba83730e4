"""The sampling fields of a Responses request, and the values each accepts.

A dataset row's ``responses_create_params`` goes to the model only after the agent has seeded a
session and the rollout has started; a ``temperature: "hot"`` found there costs a whole rollout
(and, with ``--num-repeats``, thousands) before the model server refuses it. Checking the known
sampling fields here, for every row before anything is sent, turns that into one line per bad
value: ``file:line: responses_create_params.temperature: must be a number from 0 to 2``. The same
table checks the command-line overrides (``--temperature``...), so a row and a flag are held to
the same rule.

Only fields whose meaning is fixed by the Responses API (and ``seed``, which polygym sends) are
checked; any other field passes through untouched for the model server to judge. ``null`` means
"unset" in the API, so it is accepted everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingField:
    """What one field accepts: an integer or any number, within ``low``..``high`` (inclusive)."""

    integer: bool
    low: float | None = None
    high: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable, or None when it is."""
        if value is None:
            return None
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not number or (self.integer and not isinstance(value, int)):
            return f"must be {self._describe()}, got {value!r}"
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            return f"must be {self._describe()}, got {value!r}"
        return None

    def _describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            return f"{kind} from {self.low:g} to {self.high:g}"
        if self.low is not None:
            return f"{kind} of at least {self.low:g}"
        return kind


@dataclass(frozen=True)
class FlagField:
    """A true/false field (``parallel_tool_calls``)."""

    def problem(self, value: Any) -> str | None:
        if value is None or isinstance(value, bool):
            return None
        return f"must be true or false, got {value!r}"


SAMPLING_FIELDS: dict[str, SamplingField | FlagField] = {
    "temperature": SamplingField(integer=False, low=0, high=2),
    "top_p": SamplingField(integer=False, low=0, high=1),
    "max_output_tokens": SamplingField(integer=True, low=1),
    "top_logprobs": SamplingField(integer=True, low=0, high=20),
    "max_tool_calls": SamplingField(integer=True, low=1),
    "seed": SamplingField(integer=True),
    "parallel_tool_calls": FlagField(),
}
"""Known sampling fields of ``responses_create_params`` and what each accepts."""


def sampling_problems(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, problem)`` for every known sampling field of ``params`` with a value it does not accept."""
    found = []
    for name, rule in SAMPLING_FIELDS.items():
        if name in params:
            problem = rule.problem(params[name])
            if problem is not None:
                found.append((name, problem))
    return found
