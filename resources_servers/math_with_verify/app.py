"""Math problems with exact answers, checked symbolically with math-verify; no tools.

The model answers in one message; ``verify`` extracts its final answer (``\\boxed{...}`` first,
then anchored forms such as ``Answer: 3/4`` or ``the final answer is 3/4``, and only when
``allow_unanchored`` is on, the last bare expression in the text) and compares it with the row's
``expected_answer`` symbolically, so ``0.75``, ``3/4`` and ``\\frac{6}{8}`` all match ``3/4``.

Parsing and comparing with sympy can take long on adversarial text, so it runs in a worker process
with a hard time limit (the server's ``cpu_pool``, ``cpu_workers`` processes) and never on the event
loop; an overrun or a crashed worker gives reward 0 with ``grading_error`` set, never a 500 or a hang.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Annotated, Any

from pebble import ProcessExpired
from pydantic import BeforeValidator, Field, StringConstraints

from polygym import (
    CpuTimeout,
    HTTPError,
    ResourcesServer,
    ResourcesServerConfig,
    VerifyRequest,
    VerifyResponse,
    message_item,
    metrics,
    require_extra,
)
from resources_servers.math_with_verify.grading import answer_latex, grade, warm_up


class MathWithVerifyConfig(ResourcesServerConfig):
    verify_timeout_s: float = Field(default=10.0, gt=0, description="Hard limit for one verification.")
    cpu_workers: int | None = Field(
        default=None, ge=1, description="Grading worker processes (null: min(4, CPU count))."
    )
    max_answer_chars: int = Field(
        default=50_000, ge=100, description="Only the last this-many characters of the answer are parsed."
    )
    # Off by default: a bare expression is also what a policy gets by restating the question
    # ("Compute 3/2 - 3/9." parses as 7/6), which would reward echoing instead of solving.
    allow_unanchored: bool = Field(
        default=False,
        description="Also accept a bare final expression when no \\boxed{} or 'Answer:' is found.",
    )


def _as_text(value: Any) -> Any:
    """Numbers in ``expected_answer`` are accepted and written as text (finite ones only)."""
    if isinstance(value, bool):
        return value  # rejected by the str type below
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return repr(value)
    return value


ExpectedAnswer = Annotated[
    str, BeforeValidator(_as_text), StringConstraints(strip_whitespace=True, min_length=1, max_length=1000)
]


class MathVerifyRequest(VerifyRequest):
    expected_answer: ExpectedAnswer


class MathVerifyResponse(MathVerifyRequest, VerifyResponse):
    extracted_answer: str | None
    extracted_text: str | None
    grading_error: str | None


class MathWithVerify(ResourcesServer[MathWithVerifyConfig]):
    reverify_mode = "stateless"  # verify reads only the row and the response
    cpu_worker_initializer = warm_up

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        require_extra(self.name, "envs", "math_verify", "sympy")  # imported by the workers only

    async def verify(self, body: MathVerifyRequest) -> MathVerifyResponse:
        """Reward 1 iff the extracted final answer equals ``expected_answer`` symbolically, else 0."""
        text = body.response.output_text()
        text = text.rsplit("</think>", 1)[-1]  # a completed reasoning block is not the answer
        text = text[-self.config.max_answer_chars :]
        # math-verify's own step limits (whole seconds) stay well inside the hard limit.
        step_timeout_s = max(1, int(self.config.verify_timeout_s / 4))
        error = None
        try:
            graded = await self.cpu_pool.run(
                grade,
                text,
                body.expected_answer,
                self.config.allow_unanchored,
                step_timeout_s,
                timeout_s=self.config.verify_timeout_s,
            )
        except CpuTimeout as exc:
            graded, error = None, f"timeout: {exc}"
        except ProcessExpired as exc:
            graded, error = None, f"worker died: {exc}"
        if graded is not None and not graded["gold_ok"]:
            raise HTTPError(
                422,
                f"expected_answer: math-verify could not parse {body.expected_answer!r} as an answer",
                "validation_error",
            )
        graded = graded or {}
        return MathVerifyResponse.of(
            body,
            reward=1.0 if graded.get("correct") else 0.0,
            extracted_answer=graded.get("extracted_answer"),
            extracted_text=graded.get("extracted_text"),
            grading_error=error,
        )

    def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """The standard metrics with majority@k over ``extracted_answer``, plus reward per problem type."""
        result = metrics.aggregate(rollouts, answer_field="extracted_answer")
        by_type: dict[str, list[float]] = defaultdict(list)
        for rollout in rollouts:
            reward = rollout.get("reward")
            if isinstance(rollout.get("problem_type"), str) and isinstance(reward, int | float):
                by_type[rollout["problem_type"]].append(float(reward))
        for problem_type, rewards in sorted(by_type.items()):
            result["agent_metrics"][f"mean/reward_by_type/{problem_type}"] = sum(rewards) / len(rewards)
        return result

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A correct rollout's output: one message ending in the boxed expected answer."""
        answer = str(row["expected_answer"]).strip()
        return [
            message_item(
                f"Working through the problem gives the result.\n\n$\\boxed{{{answer_latex(answer)}}}$"
            )
        ]
