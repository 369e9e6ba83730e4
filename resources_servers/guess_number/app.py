"""A multi-turn guessing game on the reset/step protocol: find a hidden number from higher/lower hints.

Each step is one guess; the observation says whether the hidden number is higher or lower, and how
many guesses are left. Finding it ends the episode with reward 1; running out of guesses ends it
with reward 0 (a lost game is a terminal state, not a truncation). Budgets in the shipped data are
one more than binary search needs, so an agent that keeps track of the interval always wins and one
that guesses at random usually does not: the reward measures multi-step reasoning over feedback.

The game logic is pure (``intro`` and ``judge``), so the server, the data generator and
``example_solution`` share it and the texts a model sees are reproducible byte for byte.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, model_validator

from polygym import EpisodicServer, Session, StepResult, function_call_item, function_call_output_item

TAG = re.compile(r"<guess>\s*(-?\d+)\s*</guess>", re.IGNORECASE)
NUMBER = re.compile(r"-?\d+")
MAX_DIGITS = 18  # longer numbers are out of any range here (and int() of huge strings is slow)


class GameSpec(BaseModel):
    """The row's ``game`` field."""

    low: int
    high: int
    secret: int
    max_guesses: int = Field(ge=1, le=100)

    @model_validator(mode="after")
    def _consistent(self) -> GameSpec:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if not self.low <= self.secret <= self.high:
            raise ValueError(f"secret ({self.secret}) must lie in [{self.low}, {self.high}]")
        return self


class GameRow(BaseModel):
    """What ``reset`` needs from a dataset row (other fields are ignored)."""

    game: GameSpec


def parse_guess(action: str) -> int | None:
    """The number in ``<guess>N</guess>`` if present, else the last integer in the text."""
    tagged = TAG.findall(action)
    found = tagged or NUMBER.findall(action)
    if not found:
        return None
    text = found[-1]
    if len(text.lstrip("-")) > MAX_DIGITS:
        return 10**MAX_DIGITS  # out of range, reported as such
    return int(text)


def intro(spec: GameSpec) -> str:
    return (
        f"I am thinking of a whole number between {spec.low} and {spec.high} (inclusive). "
        f"You have {spec.max_guesses} guesses. After each guess I will tell you whether the number is "
        "higher or lower. Give one guess per turn."
    )


def _left(n: int) -> str:
    return f"{n} guess{'es' if n != 1 else ''} left."


def judge(spec: GameSpec, guesses_made: int, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Score one guess (``guesses_made`` before it): observation, reward, game over, info."""
    used = guesses_made + 1
    left = spec.max_guesses - used
    guess = parse_guess(action)
    info: dict[str, Any] = {"guess": guess, "guesses_used": used}
    if guess == spec.secret:
        won = (
            f"Correct! The number was {spec.secret}. You found it in {used} guess{'es' if used != 1 else ''}."
        )
        return won, 1.0, True, {**info, "won": True}
    if guess is None:
        text = (
            "I could not find a whole number in your reply. "
            f"Reply with a number from {spec.low} to {spec.high}."
        )
    elif not spec.low <= guess <= spec.high:
        text = f"{guess} is outside the range: the number is between {spec.low} and {spec.high}."
    elif guess < spec.secret:
        text = f"{guess} is too low. The number is higher."
    else:
        text = f"{guess} is too high. The number is lower."
    if left <= 0:
        return (
            f"{text} You are out of guesses: the number was {spec.secret}.",
            0.0,
            True,
            {**info, "won": False},
        )
    return f"{text} {_left(left)}", 0.0, False, info


def binary_search_guesses(spec: GameSpec) -> list[int]:
    """The guesses of an interval-halving player, ending with the secret."""
    low, high, guesses = spec.low, spec.high, []
    while True:
        middle = (low + high) // 2
        guesses.append(middle)
        if middle == spec.secret:
            return guesses
        low, high = (middle + 1, high) if middle < spec.secret else (low, middle - 1)


class GuessNumber(EpisodicServer):
    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A winning rollout as the gymnasium agent records it: intro, then act calls and their hints."""
        spec = GameSpec.model_validate(row["game"])
        items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": intro(spec)}]}
        ]
        for made, guess in enumerate(binary_search_guesses(spec)):
            call = function_call_item("act", {"action": str(guess)})
            observation, _, _, _ = judge(spec, made, str(guess))
            items += [call, function_call_output_item(call["call_id"], observation)]
        return items

    async def reset(self, row: dict[str, Any], session: Session) -> str:
        spec = GameRow.model_validate(row).game
        session.state["game"] = {"spec": spec, "guesses": 0}
        return intro(spec)

    async def step(self, action: str, session: Session) -> StepResult:
        game = session.state["game"]
        observation, reward, over, info = judge(game["spec"], game["guesses"], action)
        game["guesses"] += 1
        return StepResult(observation, reward, terminated=over, info=info)
