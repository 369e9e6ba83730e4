"""Multiple-choice questions: the model names an option letter; reward 1 when it is the right one.

How the letter is read from the answer is configurable (``extraction`` in the server config, or per
row), because models and prompts differ and an RL signal should say what it measures:

- ``boxed``: the last ``\\boxed{...}`` must hold exactly one option letter (``\\boxed{C}``,
  ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``, ``\\boxed{C) 12 km}``); nothing else counts.
- ``answer_colon``: the last ``Answer: C`` (also ``Final answer: (C)``, ``**Answer:** C``,
  ``The answer is: C``) with an upper-case option letter.
- ``lenient``: ``boxed``, else ``answer_colon``, else the last standalone upper-case option
  letter anywhere in the text (``I'd go with B.``).
- ``boxed_or_option_text``: ``boxed``, else the one option whose text (case and spacing aside)
  the last ``\\boxed{...}`` contains (``\\boxed{Southern blotting}``).

Rows in NeMo Gym's shape (its same-named server, 0.4-0.7) are accepted: their ``grading_mode``
picks the extraction (``strict_single_letter_boxed``: ``boxed``; ``lenient_boxed``:
``boxed_or_option_text``; ``lenient_answer_colon`` and ``lenient_answer_colon_md``:
``answer_colon``), and ``uuid`` and ``metadata`` are echoed back unread.

Only letters that label one of the row's options count, and a completed ``<think>...</think>``
block is ignored. Extraction is plain regular expressions over a bounded tail of the text, so it
is fast enough to stay on the event loop.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Literal

from pydantic import Field, StrictStr, field_validator, model_validator

from polygym import (
    ResourcesServer,
    ResourcesServerConfig,
    VerifyRequest,
    VerifyResponse,
    message_item,
    metrics,
)

Extraction = Literal["boxed", "answer_colon", "lenient", "boxed_or_option_text"]
GradingMode = Literal[
    "strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"
]
GRADING_MODE_EXTRACTION: dict[str, Extraction] = {
    "strict_single_letter_boxed": "boxed",
    "lenient_boxed": "boxed_or_option_text",
    "lenient_answer_colon": "answer_colon",
    "lenient_answer_colon_md": "answer_colon",
}
"""NeMo Gym's per-row ``grading_mode`` and the extraction here that reads the same answers."""
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{([^{}]*)\}")
BOXED_LETTER = re.compile(r"^[(\[]?\s*([A-Za-z])\s*([)\]])?\s*(.*)$", re.DOTALL)
ANSWER_COLON = re.compile(
    # Possessive whitespace (*+): no backtracking, so long runs of spaces cannot make this slow.
    r"answer\s*+(?:\*\*|__)?\s*+(?:is\s*+)?[:\uff1a]\s*+(?:\*\*|__)?\s*+[(\[]?\s*+([A-Z])(?:\s*+[)\]])?(?![A-Za-z0-9'])",
    re.IGNORECASE,
)
STANDALONE = re.compile(r"(?<![A-Za-z0-9'\\])([A-Z])(?![A-Za-z0-9'\u2019])")


class McqaConfig(ResourcesServerConfig):
    extraction: Extraction = Field(
        default="boxed", description="How the option letter is read from the answer."
    )
    max_answer_chars: int = Field(
        default=20_000, ge=100, description="Only the last this-many characters of the answer are searched."
    )


def normalize_options(value: Any) -> dict[str, str]:
    """Options as ``{letter: text}`` in order, from any of the accepted row shapes.

    Accepted: a list of one-entry objects ``[{"A": "12"}, {"B": "15"}]``, one object
    ``{"A": "12", "B": "15"}``, or a list of texts ``["12", "15"]`` (lettered A, B, ... in order).
    """
    pairs: list[tuple[Any, Any]]
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) > len(LABELS):
            raise ValueError(f"at most {len(LABELS)} options")
        pairs = list(zip(LABELS, value, strict=False))
    elif isinstance(value, list) and all(isinstance(v, dict) and len(v) == 1 for v in value):
        pairs = [next(iter(v.items())) for v in value]
    else:
        raise ValueError(
            'must be a list of one-entry objects ([{"A": "..."}, ...]), an object {"A": "...", ...}, '
            "or a list of option texts"
        )
    options: dict[str, str] = {}
    for label, text in pairs:
        if not (isinstance(label, str) and len(label) == 1 and label in LABELS):
            raise ValueError(f"option label {label!r} is not a single upper-case letter")
        if not isinstance(text, str):
            raise ValueError(f"option {label} must be text, got {type(text).__name__}")
        if label in options:
            raise ValueError(f"option label {label} appears twice")
        options[label] = text
    if len(options) < 2:
        raise ValueError("at least 2 options are needed")
    return options


class McqaVerifyRequest(VerifyRequest):
    options: Any = Field(description="The options; see normalize_options for the accepted shapes.")
    expected_answer: StrictStr
    extraction: Extraction | None = None
    grading_mode: GradingMode | None = None  # NeMo Gym's name; ``extraction`` wins when both are set

    @field_validator("options")
    @classmethod
    def _options(cls, value: Any) -> Any:
        normalize_options(value)  # validate only: the row is echoed back as written
        return value

    @model_validator(mode="after")
    def _answer_is_an_option(self) -> McqaVerifyRequest:
        labels = normalize_options(self.options)
        if self.expected_answer.strip().upper() not in labels:
            raise ValueError(
                f"expected_answer {self.expected_answer!r} is not one of the options {list(labels)}"
            )
        return self


class McqaVerifyResponse(McqaVerifyRequest, VerifyResponse):
    extracted_answer: str | None
    extraction_used: Extraction
    extraction_rule: Literal["boxed", "answer_colon", "standalone_letter", "option_text"] | None


def boxed_letter(text: str, labels: str) -> str | None:
    """The option letter in the last ``\\boxed{}``, or None when it holds anything else."""
    boxes = BOXED.findall(text)
    if not boxes:
        return None
    found = BOXED_LETTER.match(TEXT_WRAPPER.sub(r"\1", boxes[-1]).strip())
    if found is None:
        return None
    letter, closer, rest = found.groups()
    # After the letter only a closing bracket or '.'/':' may lead into more text: "C) 12 km" and
    # "C. 12 km" name option C, while "Carbon" or "A and B" do not name one option.
    if rest and closer is None and rest[0] not in ".:":
        return None
    return letter.upper() if letter.upper() in labels else None


def answer_colon_letter(text: str, labels: str) -> str | None:
    letters = [m.group(1) for m in ANSWER_COLON.finditer(text) if m.group(1) in labels]
    return letters[-1] if letters else None


def standalone_letter(text: str, labels: str) -> str | None:
    letters = [m.group(1) for m in STANDALONE.finditer(text) if m.group(1) in labels]
    return letters[-1] if letters else None


def option_text_letter(text: str, labels: str, options: dict[str, str]) -> str | None:
    """The one option whose text the last ``\\boxed{}`` contains (case and spacing aside), else None."""
    boxes = BOXED.findall(text)
    if not boxes:
        return None
    boxed = {" ".join(box.split()).casefold() for box in (boxes[-1], TEXT_WRAPPER.sub(r"\1", boxes[-1]))}
    found = {
        label
        for label, option in options.items()
        if label in labels
        and (key := " ".join(option.split()).casefold())
        and any(key in box for box in boxed)
    }
    return found.pop() if len(found) == 1 else None


def extract_letter(
    text: str, labels: str, mode: Extraction, options: dict[str, str] | None = None
) -> tuple[str | None, str | None]:
    """``(letter, rule that found it)`` for ``mode``; ``(None, None)`` when nothing qualifies."""
    text = text.rsplit("</think>", 1)[-1]
    rules = {
        "boxed": [("boxed", boxed_letter)],
        "answer_colon": [("answer_colon", answer_colon_letter)],
        "lenient": [
            ("boxed", boxed_letter),
            ("answer_colon", answer_colon_letter),
            ("standalone_letter", standalone_letter),
        ],
        "boxed_or_option_text": [
            ("boxed", boxed_letter),
            ("option_text", partial(option_text_letter, options=options or {})),
        ],
    }[mode]
    for rule, extract in rules:
        letter = extract(text, labels)
        if letter is not None:
            return letter, rule
    return None, None


class Mcqa(ResourcesServer[McqaConfig]):
    reverify_mode = "stateless"  # verify reads only the row and the response

    async def verify(self, body: McqaVerifyRequest) -> McqaVerifyResponse:
        """Reward 1 iff the extracted option letter is ``expected_answer``, else 0."""
        options = normalize_options(body.options)
        labels = "".join(options)
        graded = GRADING_MODE_EXTRACTION[body.grading_mode] if body.grading_mode else None
        mode = body.extraction or graded or self.config.extraction
        text = body.response.output_text()[-self.config.max_answer_chars :]
        letter, rule = extract_letter(text, labels, mode, options)
        return McqaVerifyResponse.of(
            body,
            reward=1.0 if letter == body.expected_answer.strip().upper() else 0.0,
            extracted_answer=letter,
            extraction_used=mode,
            extraction_rule=rule,
        )

    def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """The standard metrics with majority@k over the extracted letter."""
        return metrics.aggregate(rollouts, answer_field="extracted_answer")

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A correct rollout's output: one message that every extraction mode reads as the answer."""
        letter = str(row["expected_answer"]).strip().upper()
        return [message_item(f"Option {letter} is correct.\n\nAnswer: {letter}\n\n\\boxed{{{letter}}}")]
