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

NeMo Gym's same-named server (0.4-0.7) has other names for the same counter, and its rows work
here unchanged: ``seed_session`` also reads ``initial_count``, the tools ``increment_counter``
(``count``, answers ``{"success": true}``) and ``get_counter_value`` (answers ``{"count": n}``)
act on the same counter, and a row with ``expected_count`` is rewarded as there: 1 iff the counter
ended at that value, whatever the answer says.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

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


class IncrementCounterRequest(BaseModel):
    """NeMo Gym's increment: its ``count`` is a lax int there too ("5" and 5.0 are accepted)."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(ge=-MAX_AMOUNT, le=MAX_AMOUNT, description="How much to add to the counter.")


class IncrementCounterResponse(BaseModel):
    success: bool


class CounterCount(BaseModel):
    count: int


class GetValueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CounterVerifyRequest(VerifyRequest):
    initial_value: StrictInt = Field(0, ge=-MAX_INITIAL, le=MAX_INITIAL)
    expected_final_value: StrictInt | None = None
    # NeMo Gym's names: a row with expected_count is scored on the counter alone, as there.
    initial_count: StrictInt | None = Field(None, ge=-MAX_INITIAL, le=MAX_INITIAL)
    expected_count: StrictInt | None = None

    @model_validator(mode="after")
    def _one_expectation(self) -> CounterVerifyRequest:
        if (self.expected_final_value is None) == (self.expected_count is None):
            raise ValueError(
                "give exactly one of expected_final_value (polygym) or expected_count (NeMo Gym)"
            )
        return self

    @property
    def start(self) -> int:
        return self.initial_value if self.initial_count is None else self.initial_count


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
        arguments = call.get("arguments")
        text = arguments if isinstance(arguments, str) else ""
        try:
            if call.get("name") == "increment":
                value += IncrementRequest.model_validate_json(text).amount
            elif call.get("name") == "increment_counter":
                value += IncrementCounterRequest.model_validate_json(text).count
            else:
                continue
        except ValidationError:
            continue
        accepted += 1
    return value, accepted


class ExampleSessionStateMgmt(ResourcesServer):
    async def seed_session(self, body: SeedSessionRequest, session: Session) -> dict[str, Any]:
        """Start the counter at the row's ``initial_value`` or ``initial_count`` (0 when it has none)."""
        extra = body.model_extra or {}
        initial = extra.get("initial_count", extra.get("initial_value", 0))
        if type(initial) is not int or not -MAX_INITIAL <= initial <= MAX_INITIAL:
            self.sessions.release(session.id)  # the base class created it; do not leak it
            raise HTTPError(
                422,
                f"initial_value/initial_count: must be an integer in [{-MAX_INITIAL}, {MAX_INITIAL}], "
                f"got {initial!r}",
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

    @tool
    async def increment_counter(
        self, body: IncrementCounterRequest, session: Session
    ) -> IncrementCounterResponse:
        """Add ``count`` to the counter (NeMo Gym's name for ``increment``)."""
        await self.increment(IncrementRequest(amount=body.count), session)
        return IncrementCounterResponse(success=True)

    @tool
    async def get_counter_value(self, body: GetValueRequest, session: Session) -> CounterCount:
        """Read the counter (NeMo Gym's name for ``get_value``)."""
        return CounterCount(count=session.state.get("value", 0))

    async def verify(self, body: CounterVerifyRequest, session: Session) -> CounterVerifyResponse:
        """Reward 1 iff the counter ended at ``expected_final_value`` and the answer reports that value.

        The counter is the seeded session's, or the replayed increments when no session was seeded.
        A NeMo Gym row (``expected_count``) needs only the counter at that value.
        """
        output = body.response.output
        if session.state.get("seeded"):
            final, source, count = session.state["value"], "session", session.state.get("increments", 0)
        else:
            final, count = replay_increments(output, body.start)
            source = "replay"
        reported = reported_value(body.response.output_text())
        expected = body.expected_count if body.expected_final_value is None else body.expected_final_value
        counter_ok = final == expected
        answer_ok = reported == expected or body.expected_final_value is None
        return CounterVerifyResponse.of(
            body,
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
        """A correct rollout's output items: every increment in order, get_value, then the answer.

        A NeMo Gym row (``expected_count``) is played with NeMo Gym's tools: one increment_counter
        covering the difference, then get_counter_value.
        """
        if "expected_count" in row:
            start, target = int(row.get("initial_count", 0)), int(row["expected_count"])
            call = function_call_item("increment_counter", {"count": target - start})
            read = function_call_item("get_counter_value", {})
            return [
                call,
                function_call_output_item(call["call_id"], '{"success": true}'),
                read,
                function_call_output_item(read["call_id"], f'{{"count": {target}}}'),
                message_item(f"The count is {target}."),
            ]
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
