"""Several dependent tool calls in one rollout: look up each word, then submit all values in order.

It checks that a policy can plan a sequence of calls, carry results from earlier tool outputs into
a later call, and keep the requested order. Tools, row fields and reward match NeMo Gym's
same-named server (0.4-0.7): a word's value is the sum of its characters' code points, exactly as
written, so NeMo Gym's rows (``Blazing`` -> 711) are solvable here and nothing is stored per task.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictInt

from polygym import ResourcesServer, Session, VerifyRequest, VerifyResponse, tool


def synonym_value(word: str) -> int:
    """The sum of the word's Unicode code points, case and spaces included: NeMo Gym's value."""
    return sum(map(ord, word))


class GetSynonymValueRequest(BaseModel):
    synonym: str = Field(description="The word to look up.")


class GetSynonymValueResponse(BaseModel):
    synonym_value: int


class ExtractSynonymValuesRequest(BaseModel):
    # Strict ints: a submission of strings like "42" is rejected here rather than silently coerced,
    # matching verify, which does not count it either.
    synonym_values: list[StrictInt] = Field(description="The values, in the order the words were given.")


class ExtractSynonymValuesResponse(BaseModel):
    success: bool


class SynonymVerifyRequest(VerifyRequest):
    expected_synonyms: list[str]
    expected_synonym_values: list[int]
    # NeMo Gym's rows also name a decoy: the term itself, whose value must not be submitted.
    minefield_label: str | None = None
    minefield_label_value: int | None = None


class SynonymVerifyResponse(SynonymVerifyRequest, VerifyResponse):
    extracted_synonym_values: list[int] | None
    ordered_match: bool
    set_overlap: float
    num_lookups: int
    recorded_synonym_values: list[int] | None
    original_term_minefield_hit: bool
    order_instruction_following_failure: bool


def _submitted(arguments: dict | None) -> list[int] | None:
    """The submitted list, or None when the arguments are not a list of integers."""
    values = (arguments or {}).get("synonym_values")
    if isinstance(values, list) and all(type(v) is int for v in values):
        return values
    return None


class ExampleMultiStep(ResourcesServer):
    @tool
    async def get_synonym_value(self, body: GetSynonymValueRequest) -> GetSynonymValueResponse:
        """Look up the synonym value (an integer) of one word."""
        return GetSynonymValueResponse(synonym_value=synonym_value(body.synonym))

    @tool
    async def extract_synonym_values(
        self, body: ExtractSynonymValuesRequest, session: Session
    ) -> ExtractSynonymValuesResponse:
        """Submit the synonym values of all the words, in the order the words were given."""
        session.state.setdefault("submissions", []).append(list(body.synonym_values))
        return ExtractSynonymValuesResponse(success=True)

    async def verify(self, body: SynonymVerifyRequest, session: Session) -> SynonymVerifyResponse:
        """Reward 1 iff the last extract_synonym_values call in the output has exactly the expected list.

        The rollout's own output is the evidence (it is what training sees); the submissions this
        session recorded are reported alongside for debugging an agent that drops tool calls.
        """
        calls = body.response.function_calls()
        submits = [c for c in calls if c.name == "extract_synonym_values"]
        extracted = _submitted(submits[-1].arguments) if submits else None
        expected = body.expected_synonym_values
        # Divided by the list's length, repeats included, as NeMo Gym reports it.
        overlap = len(set(expected) & set(extracted or ())) / len(expected) if expected else 0.0
        ordered = extracted == expected
        mines = {body.minefield_label, body.minefield_label_value} - {None}
        recorded = session.state.get("submissions") or [None]
        return SynonymVerifyResponse.of(
            body,
            reward=1.0 if ordered else 0.0,
            extracted_synonym_values=extracted,
            ordered_match=ordered,
            set_overlap=overlap,
            num_lookups=sum(c.name == "get_synonym_value" for c in calls),
            recorded_synonym_values=recorded[-1],
            original_term_minefield_hit=bool(mines & set(extracted or ())),
            order_instruction_following_failure=not ordered and overlap == 1.0,
        )
