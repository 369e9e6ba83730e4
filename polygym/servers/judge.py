"""Asking a judge model from inside a verifier, with judge failures kept apart from rewards.

Free-form answers (an explanation, a proof sketch, a paraphrase) have no regex verifier; an LLM
judge compares them with a reference. A judge is a model server of the stack, named in the
environment's config (``judge_model_server``, NeMo Gym's field name), so it is placed, replaced and
secured like the policy, and the same scripted model can play it in tests.

Why failures are first class: a judge that is down, rate-limited or answers something its parser
cannot read says nothing about the policy. Scoring such a row 0 would teach the policy that its
answer was wrong, and averaging it in would move the metrics with the judge's health. So a judge
that cannot give a verdict raises ``JudgeFailed``: the ``/verify`` call fails with the failure
class ``judge_failed`` (carried back in ``polygym.net.failure``'s header, final, so no hop retries
it), the collector writes the row to ``_failures.jsonl`` under that class, aggregates
leave it out, and ``--resume`` plays it again.

Retries do not multiply: transport problems (429, 5xx, resets) are already retried by the client
under its one policy, so a call that still fails is final here; only a reply the parser cannot read
is asked again, ``judge_attempts`` times in all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from polygym.kinds import MODEL_KIND
from polygym.net.client import ServerCallError, ServerClient
from polygym.protocol import output_text
from polygym.servers.agent import ServerRef
from polygym.servers.base import HTTPError

T = TypeVar("T")

JUDGE_FAILED = "judge_failed"
"""The error type of a ``/verify`` whose judge gave no verdict, and the failure class it becomes."""
JUDGE_FAILED_STATUS = 424
"""Failed Dependency: not a transient status, so no caller re-runs the verification on its own."""


class JudgeSettings(BaseModel):
    """Config fields of an environment that asks a judge; mix into its ``ResourcesServerConfig``."""

    judge_model_server: ServerRef = Field(
        default=ServerRef(type=MODEL_KIND, name="policy_model"),
        description="The model server that judges, by name in the stack.",
    )
    judge_responses_create_params: dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 0.0, "max_output_tokens": 512},
        description="Sampling fields of every judge request (its input is the judge prompt).",
    )
    judge_attempts: int = Field(
        default=2, ge=1, le=5, description="Asks per verdict when the judge's reply cannot be parsed."
    )
    judge_timeout_s: float = Field(default=120.0, gt=0, description="One judge call.")


class UnreadableVerdict(ValueError):
    """The judge answered, but not in the form its parser reads."""


class JudgeFailed(HTTPError):
    """No verdict: the judge was unreachable, failed, or never answered in a readable form."""

    def __init__(self, message: str) -> None:
        super().__init__(JUDGE_FAILED_STATUS, message, JUDGE_FAILED, error_class=JUDGE_FAILED)


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """What the judge decided (``value``), its own words, and how many asks it took."""

    value: T
    text: str
    attempts: int


class Judge(Generic[T]):
    """One judge model and one parser; ``ask`` returns a ``Verdict`` or raises ``JudgeFailed``."""

    def __init__(self, client: ServerClient, settings: JudgeSettings, parse: Callable[[str], T]) -> None:
        self.client = client
        self.settings = settings
        self.parse = parse

    async def ask(self, prompt: str) -> Verdict[T]:
        """Ask the judge ``prompt`` until its reply parses, at most ``judge_attempts`` times."""
        unreadable = ""
        for attempt in range(1, self.settings.judge_attempts + 1):
            text = await self._reply_text(prompt)
            try:
                return Verdict(self.parse(text), text, attempt)
            except UnreadableVerdict as exc:
                unreadable = f"{exc} (reply: {text[:200]!r})"
        raise JudgeFailed(
            f"judge '{self.settings.judge_model_server.name}' gave no readable verdict in "
            f"{self.settings.judge_attempts} attempt(s): {unreadable}"
        )

    async def _reply_text(self, prompt: str) -> str:
        name = self.settings.judge_model_server.name
        request = {
            **self.settings.judge_responses_create_params,
            "input": [{"role": "user", "content": prompt}],
        }
        try:
            reply = await self.client.call(
                name, "/v1/responses", request, timeout_s=self.settings.judge_timeout_s
            )
            response = reply.json()
        except ServerCallError as exc:
            raise JudgeFailed(f"judge '{name}' failed: {exc.error_class}: {exc.detail}") from exc
        except ValueError as exc:
            raise JudgeFailed(f"judge '{name}' sent a reply that is not JSON: {exc}") from exc
        if not isinstance(response, dict):
            raise JudgeFailed(f"judge '{name}' sent no Response object")
        return output_text(response.get("output") or [])
