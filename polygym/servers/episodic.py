"""Reset/step environments (Gymnasium style) on top of the resources-server machinery.

A subclass implements two methods and gets HTTP routes, per-rollout episode state and a verifier::

    class Guess(EpisodicServer):
        async def reset(self, row, session) -> str:            # the first observation
            ...
        async def step(self, action, session) -> StepResult:   # or a 5-tuple, as in Gymnasium
            ...

Routes: ``POST /reset`` (body: the dataset row, or ``{}`` to use the row sent to ``/seed_session``)
answers ``{"observation", "info"}``; ``POST /step`` (body: ``{"action": str}``) answers
``{"observation", "reward", "terminated", "truncated", "info"}``. Both are keyed by the session
cookie, like tools. ``/step`` before ``/reset`` or after the episode ended is a 409; an action over
``MAX_ACTION_CHARS`` is a 422. The base truncates an episode after ``max_episode_steps``.

``verify`` returns the episode's total reward and its per-step rewards from the session. When the
session played no step (a cookie-less verify, a re-verification of a saved rollout, a conformance
check), it *replays* the rollout instead: it resets a scratch session from the row and steps
through the actions found in ``response.output``, read with ``turn_action`` — the same rule the
gymnasium agent applies while playing — so a saved rollout verifies to the reward it earned live.

The action rule, per model turn (the items between two observations): the ``action`` argument of
the first function call named ``ACTION_TOOL`` if there is one (numbers are turned into text; any
other argument shape means "no action this turn"), else the turn's assistant text if it is not
blank, else no action. A turn with no action is not stepped: the agent answers it with an error.

Subclass notes: keep per-episode state in ``session.state`` (the base owns the ``_episode`` key),
raise ``KeyError``/``ValueError`` (or a pydantic ValidationError) from ``reset`` for a bad row —
it becomes a 422 —, call ``super().seed_session`` if you override it, and override the
``example_solution(row)`` classmethod to return a winning rollout's output items so conformance
checks can verify a correct episode through replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.routing import Route

from polygym.items import item_text
from polygym.protocol import SeedSessionRequest, VerifyRequest, VerifyResponse
from polygym.servers.base import HTTPError, json_endpoint, validation_message
from polygym.servers.resources import ResourcesServer, ResourcesServerConfig
from polygym.servers.sessions import Session

ACTION_TOOL = "act"
MAX_ACTION_CHARS = 100_000
EPISODE_KEY = "_episode"
OBSERVATION_TYPES = frozenset({"function_call_output"})
MODEL_TYPES = frozenset({"message", "function_call", "reasoning"})


def action_tool_schema(description: str = "") -> dict[str, Any]:
    """The Responses ``tools`` entry agents offer for taking one action."""
    return {
        "type": "function",
        "name": ACTION_TOOL,
        "description": description
        or "Take one action in the environment. The result is the environment's next observation.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "description": "The action, as the rules describe it."}
            },
            "required": ["action"],
        },
        "strict": False,
    }


@dataclass
class StepResult:
    """What ``step`` returns; a plain 5-tuple ``(obs, reward, terminated, truncated, info)`` also works."""

    observation: Any
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnAction:
    """The action of one model turn: ``action`` is None when the turn's call had unusable arguments."""

    action: str | None
    call_id: str | None = None  # the function call that carried it (its output is the observation)
    error: str | None = None


def _is_observation(item: dict[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in OBSERVATION_TYPES or (kind == "message" and item.get("role") not in (None, "assistant"))


def turn_action(items: list[dict[str, Any]]) -> TurnAction:
    """The action one model turn took (see the module docstring for the rule)."""
    for item in items:
        if item.get("type") == "function_call" and item.get("name") == ACTION_TOOL:
            call_id = str(item.get("call_id", ""))
            try:
                arguments = orjson.loads(item.get("arguments") or "{}")
            except orjson.JSONDecodeError:
                return TurnAction(None, call_id, 'the arguments are not valid JSON; send {"action": "..."}')
            value = arguments.get("action") if isinstance(arguments, dict) else None
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                return TurnAction(None, call_id, "the arguments need an 'action' string")
            return TurnAction(value if isinstance(value, str) else str(value), call_id)
    texts = [
        item_text(item)
        for item in items
        if item.get("type", "message") == "message" and item.get("role", "assistant") == "assistant"
    ]
    text = "\n".join(t for t in texts if t)
    if not text.strip():
        calls = any(item.get("type") == "function_call" for item in items)
        return TurnAction(None, None, f"call the {ACTION_TOOL} tool" if calls else "the reply was empty")
    return TurnAction(text)


def split_turns(output: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Model turns of a rollout: runs of model items, split wherever an observation stands."""
    turns: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if _is_observation(item):
            if current:
                turns.append(current)
            current = []
        elif item.get("type", "message") in MODEL_TYPES:
            current.append(item)
    if current:
        turns.append(current)
    return turns


class EpisodicConfig(ResourcesServerConfig):
    max_episode_steps: int = Field(50, ge=1, description="steps before the base truncates an episode")


class StepRequest(BaseModel):
    action: str = Field(max_length=MAX_ACTION_CHARS, description="The action to take.")


class EpisodicVerifyResponse(VerifyResponse):
    step_rewards: list[float]
    num_steps: int
    terminated: bool
    truncated: bool
    reward_source: str  # "session": the live episode; "replay": replayed from response.output


EpisodicConfigT = TypeVar("EpisodicConfigT", bound=EpisodicConfig)


class EpisodicServer(ResourcesServer[EpisodicConfigT]):
    """A reset/step environment: subclasses implement ``reset`` and ``step``."""

    # -- to override -------------------------------------------------------------------------
    async def reset(self, row: dict[str, Any], session: Session) -> Any:
        """Start an episode for ``row``; returns the first observation (text, or JSON data)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement reset")

    async def step(self, action: str, session: Session) -> StepResult | tuple[Any, float, bool, bool, dict]:
        """Apply ``action``; returns the observation, reward, terminated, truncated and info."""
        raise NotImplementedError(f"{type(self).__name__} does not implement step")

    # -- machinery ---------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        return [
            *super().routes(),
            Route("/reset", json_endpoint(self._reset_route), methods=["POST"]),
            Route("/step", json_endpoint(self._step_route, StepRequest), methods=["POST"]),
        ]

    async def seed_session(self, body: SeedSessionRequest, session: Session) -> dict[str, Any] | None:
        session.state[EPISODE_KEY] = {"row": body.model_dump(), "started": False}
        return None

    async def start_episode(self, row: dict[str, Any], session: Session) -> dict[str, Any]:
        """Reset ``session`` for ``row`` (a new episode, even mid-episode); the /reset reply."""
        try:
            observation = await self.reset(row, session)
        except ValidationError as exc:
            raise HTTPError(
                422, f"cannot start an episode from this row: {validation_message(exc)}", "validation_error"
            ) from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPError(422, f"cannot start an episode from this row: {exc}", "validation_error") from exc
        session.state[EPISODE_KEY] = {
            "row": row,
            "started": True,
            "done": False,
            "terminated": False,
            "truncated": False,
            "rewards": [],
        }
        return {"observation": observation, "info": {"max_episode_steps": self.config.max_episode_steps}}

    async def take_step(self, action: str, session: Session) -> dict[str, Any]:
        """One step of the session's episode, with the base's bookkeeping; the /step reply."""
        episode = session.state.get(EPISODE_KEY) or {}
        if not episode.get("started"):
            raise HTTPError(409, "no episode in this session: call /reset first", "no_episode")
        if episode["done"]:
            raise HTTPError(409, "the episode is over: call /reset to start another", "episode_over")
        result = await self.step(action, session)
        if not isinstance(result, StepResult):
            result = StepResult(*result)
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"{type(self).__name__}.step returned a non-finite reward {result.reward!r}")
        episode["rewards"].append(reward)
        terminated, truncated = bool(result.terminated), bool(result.truncated)
        if not terminated and len(episode["rewards"]) >= self.config.max_episode_steps:
            truncated = True
        episode.update(done=terminated or truncated, terminated=terminated, truncated=truncated)
        return {
            "observation": result.observation,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": result.info,
        }

    async def _reset_route(self, body: Any, request: Request) -> Any:
        session = self._session_for(request)
        if not isinstance(body, dict):
            raise HTTPError(
                422, "the /reset body must be a JSON object: the dataset row, or {}", "validation_error"
            )
        row = body or (session.state.get(EPISODE_KEY) or {}).get("row")
        if not row:
            raise HTTPError(
                422,
                "/reset needs the dataset row: send it as the body, or call /seed_session with it first",
                "validation_error",
            )
        return self._with_cookie(request, await self.start_episode(row, session))

    async def _step_route(self, body: StepRequest, request: Request) -> Any:
        session = self._session_for(request)
        return self._with_cookie(request, await self.take_step(body.action, session))

    async def verify(self, body: VerifyRequest, session: Session) -> EpisodicVerifyResponse:
        """The episode's total reward, from the session or else replayed from ``response.output``."""
        episode = session.state.get(EPISODE_KEY) or {}
        source = "session"
        if not episode.get("rewards"):
            source = "replay"
            episode = await self.replay(body.model_dump(exclude={"response"}), body.response.output)
        rewards = list(episode.get("rewards") or [])
        low, high = self.config.reward_range
        total = min(high, max(low, math.fsum(rewards)))
        return EpisodicVerifyResponse.of(
            body,
            reward=total,
            step_rewards=rewards,
            num_steps=len(rewards),
            terminated=bool(episode.get("terminated")),
            truncated=bool(episode.get("truncated")),
            reward_source=source,
        )

    async def replay(self, row: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
        """Play the actions of ``output`` in a scratch session; its episode record."""
        scratch = Session(id="replay")
        await self.start_episode(row, scratch)
        episode = scratch.state[EPISODE_KEY]
        for turn in split_turns(output):
            if episode["done"]:
                break
            action = turn_action(turn).action
            if action is None or len(action) > MAX_ACTION_CHARS:
                continue  # the agent got an error back instead of a step
            await self.take_step(action, scratch)
        return episode
