"""Write one sentence under word-level constraints: a keyword it must hold (anywhere, or as its
first word) and a limit on its length in words. Reward 1 when every constraint holds, else 0.

A small instruction-following task whose verifier is a few regular expressions, so a reward is
exact and cheap. It exists to be the "other benchmark" of interference experiments: a small
instruct model already follows most of these instructions (so training on something else can
only keep or lose that), and whether it still does is a yes/no per prompt (paired tests apply).

What "one sentence" means here: after stripping the reply and one pair of surrounding quotes,
the text holds letters, and no sentence-ending mark (``.``, ``!``, ``?``) is followed by more words.
Words are runs of letters, digits and apostrophes (hyphenated words count once); the keyword
matches a whole word, case and a trailing ``'s`` aside (``River`` and ``river's`` match ``river``,
``rivers`` does not).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, StrictStr

from polygym import (
    ResourcesServer,
    ResourcesServerConfig,
    VerifyRequest,
    VerifyResponse,
    message_item,
)

Position = Literal["anywhere", "first"]
WORD = re.compile(r"[A-Za-z0-9']+(?:-[A-Za-z0-9']+)*")
SENTENCE_BREAK = re.compile(r"[.!?]+[\"')\]]*\s+(?=\S)")
QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}


class KeywordConstraintsConfig(ResourcesServerConfig):
    max_answer_chars: int = Field(
        default=2_000, ge=10, description="Longer replies score 0 unread (no sentence is this long)."
    )


class KeywordVerifyRequest(VerifyRequest):
    keyword: StrictStr = Field(min_length=1, pattern=r"^[A-Za-z0-9']+$")
    position: Position = "anywhere"
    max_words: int = Field(ge=1)


class KeywordVerifyResponse(KeywordVerifyRequest, VerifyResponse):
    word_count: int
    single_sentence: bool
    keyword_found: bool
    """The keyword is where it must be (anywhere, or first)."""
    within_limit: bool


def strip_quotes(text: str) -> str:
    """The reply without surrounding whitespace and one pair of surrounding quotes."""
    text = text.strip()
    if len(text) >= 2 and QUOTES.get(text[0]) == text[-1]:
        text = text[1:-1].strip()
    return text


def check(text: str, keyword: str, position: Position, max_words: int) -> dict[str, Any]:
    """Each constraint's verdict on ``text`` and the word count."""
    sentence = strip_quotes(text)
    words = WORD.findall(sentence)
    lowered = [w.lower().removesuffix("'s") for w in words]
    key = keyword.lower()
    found = bool(lowered) and (lowered[0] == key if position == "first" else key in lowered)
    return {
        "word_count": len(words),
        "single_sentence": bool(words) and SENTENCE_BREAK.search(sentence) is None,
        "keyword_found": found,
        "within_limit": 0 < len(words) <= max_words,
    }


class KeywordConstraints(ResourcesServer[KeywordConstraintsConfig]):
    reverify_mode = "stateless"  # verify reads only the row and the response

    async def verify(self, body: KeywordVerifyRequest) -> KeywordVerifyResponse:
        """Reward 1 iff the reply is one sentence, holds the keyword where asked and is short enough."""
        text = body.response.output_text()
        if len(text) > self.config.max_answer_chars:
            text = ""
        verdict = check(text, body.keyword, body.position, body.max_words)
        passed = verdict["single_sentence"] and verdict["keyword_found"] and verdict["within_limit"]
        return KeywordVerifyResponse.of(body, **verdict, reward=1.0 if passed else 0.0)

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The keyword in a three-word sentence (first when asked), within every shipped limit."""
        keyword = str(row["keyword"])
        if row.get("position", "anywhere") == "first":
            return [message_item(f"{keyword.capitalize()} looks fine.")]
        return [message_item(f"I like {keyword}.")]
