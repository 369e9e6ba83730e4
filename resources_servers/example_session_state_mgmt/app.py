"""Per-rollout state: a counter seeded from the row, changed and read with tools, checked at verify.

It shows how an environment keeps state for one rollout without leaking it into another: the
counter lives in the rollout's ``Session`` (keyed by the session cookie), ``seed_session`` sets its
start value from the dataset row, ``increment`` and ``get_value`` act on it, and ``verify`` reads
the value the rollout actually left behind. The start value is *not* in the prompt, so a policy
must read the counter with ``get_value`` to report the final value.

A verify without a seeded session (a cookie-less call: offline re-verification of saved rollouts,
or a conformance check) replays the rollout's own ``increment`` calls from the row's
``initial_value``, accepting exactly the calls the tool would have accepted, so the same rollout
gets the same reward either way.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from polygym import (
    HTTPError,
    ResourcesServer,
    SeedSessionRequest,
    Session,
    VerifyRequest,
    VerifyResponse,
    function_call_item,
    function_call_output_item,
    message_item,
    tool,
)

MAX_AMOUNT = 1_000_000
MAX_INITIAL = 1_000_000_000
# Integers as a model writes them; at most 18 digits so int() never meets Python's digit limit and
# the value always fits the 64-bit integers JSON encoders handle.
INTEGER = re.compile(r"(?<![\w.])[-\u2212]?\d{1,18}(?![\d\w]|\.\d)")
FINAL_ANCHOR = re.compile(r"final\s+value", re.IGNORECASE)


class IncrementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Strict: "5" or 5.0 is rejected with a 422 the model can read, rather than silently coerced.
    amount: StrictInt = Field(
        ge=-MAX_AMOUNT, le=MAX_AMOUNT, description="How much to add to the counter (negative subtracts)."
    )


class CounterValue(BaseModel):
    value: int


class GetValueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CounterVerifyRequest(VerifyRequest):
    initial_value: StrictInt = Field(ge=-MAX_INITIAL, le=MAX_INITIAL)
    expected_final_value: StrictInt


class CounterVerifyResponse(CounterVerifyRequest, VerifyResponse):
    final_value: int
    value_source: Literal["session", "replay"]
    reported_value: int | None
    counter_correct: bool
    answer_correct: bool
    num_increments: int


def reported_value(text: str) -> int | None:
    """The value the answer reports: the first integer after the last "final value", else the last one."""
    text = text.rsplit("</think>", 1)[-1]
    anchors = list(FINAL_ANCHOR.finditer(text))
    if anchors:
        found = INTEGER.search(text, anchors[-1].end())
        if found is not None:
            return int(found.group().replace("\u2212", "-"))
    numbers = INTEGER.findall(text)
    return int(numbers[-1].replace("\u2212", "-")) if numbers else None


def replay_increments(output: list[dict[str, Any]], initial_value: int) -> tuple[int, int]:
    """(final value, accepted calls) from the rollout's increment calls, as the tool would apply them."""
    value, accepted = initial_value, 0
    for call in (item for item in output if item.get("type") == "function_call"):
        if call.get("name") != "increment":
            continue
        arguments = call.get("arguments")
        try:
            request = IncrementRequest.model_validate_json(arguments if isinstance(arguments, str) else "")
        except ValidationError:
            continue
        value += request.amount
        accepted += 1
    return value, accepted


class ExampleSessionStateMgmt(ResourcesServer):
    async def seed_session(self, body: SeedSessionRequest, session: Session) -> dict[str, Any]:
        """Start the counter at the row's ``initial_value`` (0 when the row has none)."""
        initial = (body.model_extra or {}).get("initial_value", 0)
        if type(initial) is not int or not -MAX_INITIAL <= initial <= MAX_INITIAL:
            self.sessions.release(session.id)  # the base class created it; do not leak it
            raise HTTPError(
                422,
                f"initial_value: must be an integer in [{-MAX_INITIAL}, {MAX_INITIAL}], got {initial!r}",
                "validation_error",
            )
        session.state.update(value=initial, seeded=True, increments=0)
        return {"seeded": True}

    @tool
    async def increment(self, body: IncrementRequest, session: Session) -> CounterValue:
        """Add an amount to the counter and return the counter's new value."""
        session.state["value"] = session.state.get("value", 0) + body.amount
        session.state["increments"] = session.state.get("increments", 0) + 1
        return CounterValue(value=session.state["value"])

    @tool
    async def get_value(self, body: GetValueRequest, session: Session) -> CounterValue:
        """Read the counter's current value."""
        return CounterValue(value=session.state.get("value", 0))

    async def verify(self, body: CounterVerifyRequest, session: Session) -> CounterVerifyResponse:
        """Reward 1 iff the counter ended at ``expected_final_value`` and the answer reports that value.

        The counter is the seeded session's, or the replayed increments when no session was seeded.
        """
        output = body.response.output
        if session.state.get("seeded"):
            final, source, count = session.state["value"], "session", session.state.get("increments", 0)
        else:
            final, count = replay_increments(output, body.initial_value)
            source = "replay"
        reported = reported_value(body.response.output_text())
        counter_ok = final == body.expected_final_value
        answer_ok = reported == body.expected_final_value
        return CounterVerifyResponse(
            **body.model_dump(),
            reward=1.0 if counter_ok and answer_ok else 0.0,
            final_value=final,
            value_source=source,
            reported_value=reported,
            counter_correct=counter_ok,
            answer_correct=answer_ok,
            num_increments=count,
        )

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A correct rollout's output items: every increment in order, get_value, then the answer."""
        value = int(row.get("initial_value", 0))
        # Rows from elsewhere may lack the amounts: one increment then covers the difference.
        amounts = row.get("increments") or [int(row["expected_final_value"]) - value]
        items: list[dict[str, Any]] = []
        for amount in amounts:
            value += amount
            call = function_call_item("increment", {"amount": amount})
            items += [call, function_call_output_item(call["call_id"], f'{{"value": {value}}}')]
        call = function_call_item("get_value", {})
        items += [call, function_call_output_item(call["call_id"], f'{{"value": {value}}}')]
        items.append(message_item(f"All increments are applied. Final value: {value}"))
        return items
