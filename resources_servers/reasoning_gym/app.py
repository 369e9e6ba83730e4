"""Procedurally generated reasoning tasks from the ``reasoning-gym`` package, scored by its own scorers.

Each row names a reasoning-gym task (``basic_arithmetic``, ``letter_counting``...), the config
its dataset was generated with, and the generated entry (question, answer, metadata). ``verify``
extracts the final answer from the last assistant message (``<answer>...</answer>`` by default,
see ``extract_answer``) and passes it to the task's ``score_answer`` — the package's own, which
gives partial credit on some tasks — in a worker process with a hard time limit, so a scorer
stuck on a hostile answer never blocks the event loop.

Rows in NeMo Gym's shape (its same-named server, 0.4-0.7: ``question``, ``answer`` and
``metadata`` at the top level, the task in ``metadata.source_dataset``) are accepted and scored as
NeMo Gym scores them: the task's default config, and the answer read from all assistant text by
``nemo_gym_answer`` (the last answer tag, else the first ``\\boxed{}``, else the whole text).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from statistics import fmean
from typing import Any, Literal

from pebble import ProcessExpired
from pydantic import BaseModel, Field, model_validator

from polygym import (
    CpuTimeout,
    HTTPError,
    ResourcesServer,
    ResourcesServerConfig,
    VerifyRequest,
    VerifyResponse,
    item_text,
    message_item,
    metrics,
    require_extra,
)
from resources_servers.reasoning_gym.scoring import score

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
NEMO_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
NEMO_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
AnswerFormat = Literal["tag", "last_line", "tag_or_last_line"]


def extract_answer(text: str, answer_format: AnswerFormat = "tag") -> str | None:
    """The final answer in ``text``, stripped of surrounding whitespace; None when there is none.

    ``tag``: the content of the last ``<answer>...</answer>``. ``last_line``: the last non-blank
    line. ``tag_or_last_line``: the tag when present, else the last line.
    """
    if answer_format != "last_line":
        tagged = ANSWER_TAG.findall(text)
        if tagged:
            return tagged[-1].strip()
        if answer_format == "tag":
            return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def nemo_gym_answer(output: list[dict[str, Any]]) -> str:
    """The answer as NeMo Gym's reasoning_gym server reads it from a rollout's assistant messages.

    Their texts are joined; then the last case-sensitive answer tag, else the first ``\\boxed{}``
    without nested braces, else the whole text ('' when there is none), stripped.
    """
    text = "".join(item_text(item) for item in output if item.get("type") == "message")
    tagged = NEMO_ANSWER_TAG.findall(text)
    if tagged:
        return str(tagged[-1]).strip()
    boxed = NEMO_BOXED.search(text)
    return boxed.group(1).strip() if boxed else text.strip()


class Entry(BaseModel):
    """A reasoning-gym dataset item, as ``dataset[i]`` returns it."""

    question: str
    answer: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ReasoningGymConfig(ResourcesServerConfig):
    answer_format: AnswerFormat = "tag"
    max_answer_chars: int = Field(10_000, ge=1, description="longer extracted answers score 0 unscored")
    score_timeout_s: float = Field(20.0, gt=0, description="per answer, including the worker's first import")
    cpu_workers: int | None = Field(2, ge=1, description="scoring worker processes (null: min(4, CPUs))")


class ReasoningGymVerifyRequest(VerifyRequest):
    task: str = Field(min_length=1, max_length=100)
    task_config: dict[str, Any] = Field(default_factory=dict)
    entry: Entry

    @model_validator(mode="before")
    @classmethod
    def _from_nemo_gym_row(cls, data: Any) -> Any:
        """A NeMo Gym row (no ``entry``, a top-level ``question``) gets ``task`` and ``entry`` from it."""
        if not isinstance(data, dict) or "entry" in data or "question" not in data:
            return data
        metadata = data.get("metadata")
        task = metadata.get("source_dataset") if isinstance(metadata, dict) else None
        if not isinstance(task, str):
            raise ValueError("metadata.source_dataset: a NeMo Gym row must name its reasoning-gym task here")
        entry = {"question": data["question"], "answer": data.get("answer"), "metadata": metadata}
        return {**data, "task": data.get("task", task), "entry": entry, "nemo_gym_row": True}

    nemo_gym_row: bool = False
    """True when the row came in NeMo Gym's shape, so it is scored the way NeMo Gym scores it."""


class ReasoningGymVerifyResponse(ReasoningGymVerifyRequest, VerifyResponse):
    extracted_answer: str | None
    score_status: str  # ok, no_answer, answer_too_long, score_error, timeout
    score_error: str | None


class ReasoningGym(ResourcesServer[ReasoningGymConfig]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        require_extra(self.name, "envs", "reasoning_gym")  # imported by the workers only

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A correct rollout: the entry's reference answer in answer tags."""
        answer = (row.get("entry") or row).get("answer")
        if not isinstance(answer, str):
            raise ValueError("this row's entry has no reference answer")
        return [message_item(f"Let me work it out.\n<answer>{answer}</answer>")]

    async def verify(self, body: ReasoningGymVerifyRequest) -> ReasoningGymVerifyResponse:
        """Reward = the task's own score of the extracted answer (0 without an answer)."""
        if body.nemo_gym_row:
            answer: str | None = nemo_gym_answer(body.response.output)
        else:
            answer = extract_answer(body.response.output_text(), self.config.answer_format)
        if answer is None:
            return self._result(body, answer, 0.0, "no_answer", None)
        if len(answer) > self.config.max_answer_chars:
            return self._result(body, None, 0.0, "answer_too_long", f"{len(answer)} characters")
        config_json = json.dumps(body.task_config, sort_keys=True)
        entry = body.entry.model_dump()
        try:
            status, value = await self.cpu_pool.run(
                score, body.task, config_json, entry, answer, timeout_s=self.config.score_timeout_s
            )
        except CpuTimeout as exc:
            return self._result(body, answer, 0.0, "timeout", str(exc))
        except ProcessExpired as exc:
            return self._result(body, answer, 0.0, "score_error", f"the scoring worker died: {exc}")
        if status == "broken_install":  # this server's fault, not the row's: a final 500, not retried
            raise HTTPError(500, f"{value} (reinstall the [envs] extra)", "environment_broken")
        if status in ("unknown_task", "bad_config"):
            field = "task" if status == "unknown_task" else "task_config"
            raise HTTPError(422, f"{field}: {value}", "validation_error")
        if status != "ok":
            return self._result(body, answer, 0.0, status, value)
        return self._result(body, answer, value, "ok", None)

    def _result(
        self,
        body: ReasoningGymVerifyRequest,
        answer: str | None,
        reward: float,
        status: str,
        error: str | None,
    ) -> ReasoningGymVerifyResponse:
        return ReasoningGymVerifyResponse.of(
            body,
            reward=reward,
            extracted_answer=answer,
            score_status=status,
            score_error=error,
        )

    def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """The standard metrics plus ``mean/reward/<task>`` for each task in the rollouts."""
        result = metrics.aggregate(rollouts)
        by_task: dict[str, list[float]] = defaultdict(list)
        for rollout in rollouts:
            reward = rollout.get("reward")
            if isinstance(rollout.get("task"), str) and isinstance(reward, int | float):
                by_task[rollout["task"]].append(float(reward))
        for task, rewards in sorted(by_task.items()):
            result["agent_metrics"][f"mean/reward/{task}"] = fmean(rewards)
        return result
