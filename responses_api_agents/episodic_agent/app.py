"""episodic_agent: plays a reset/step environment (``polygym.servers.episodic``) turn by turn with the model.

One rollout: ``/seed_session`` with the row, ``/reset`` for the first observation, then up to
``max_steps`` times: ask the model (the conversation so far), read the turn's action, ``/step`` it,
and add the observation to the conversation; stop when the episode terminates or is truncated.
Then ``/verify`` and ``/end_session`` (always, even when something failed).

Reading the action (``polygym.servers.episodic.turn_action``, the rule the environment uses to replay a
saved rollout): the ``action`` argument of the turn's first call to the ``act`` tool, else the
turn's assistant text. ``action_mode: tool`` offers the model the ``act`` tool (unless the row's
``tools`` already has one); ``action_mode: text`` offers no tool and the model just replies. Either
way, an observation answering an ``act`` call is that call's ``function_call_output``; any other
observation is a user message. Other function calls get an error as their output, since every call
in a Responses conversation needs one.

The rollout's ``response.output`` is the whole episode in order — the first observation (a user
message), every model item, every observation — with ``usage`` summed over all model calls, so
it is a valid Responses object a trainer can tokenize. ``status`` is ``incomplete`` (and
``metadata.ng_termination_reason`` is ``max_steps``) when the agent stopped before the episode ended.

Mistakes by the model (no usable action, an action the environment rejects with a 4xx) come back to
it as an ``Error: ...`` observation and cost a turn; infrastructure failures (a server down, a lost
session, a 5xx) abort the rollout so the collector records a failure.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field

from polygym import (
    ACTION_TOOL,
    MAX_ACTION_CHARS,
    STEP_LIMIT,
    Agent,
    AgentConfig,
    HTTPError,
    RetryPolicy,
    ServerCallError,
    action_tool_schema,
    ended_early,
    function_call_output_item,
    input_items,
    new_response,
    sum_usage,
    turn_action,
)

# A step changes state: retry only when the request provably never arrived.
STEP_RETRY = RetryPolicy(attempts=3, retry_statuses=frozenset({429, 503}), retry_after_send=False)


class GymnasiumAgentConfig(AgentConfig):
    max_steps: int = Field(30, ge=1, description="model turns per episode")
    action_mode: Literal["text", "tool"] = "text"
    env_timeout_s: float = 120.0
    """seed_session, reset, one step."""


def observation_text(observation: Any) -> str:
    return observation if isinstance(observation, str) else orjson.dumps(observation).decode()


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


class GymnasiumAgent(Agent[GymnasiumAgentConfig]):
    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """Play one episode; ``body`` is a dataset row or bare create params (for environments that
        need nothing else to reset)."""
        row = (
            body
            if isinstance(body, dict) and "responses_create_params" in body
            else {"responses_create_params": body}
        )
        return await self.play_in_session(row, verify=False)

    async def seed_session(self, row: dict[str, Any]) -> dict[str, str]:
        reply = await self._env("/seed_session", row, {})
        return dict(reply.cookies)

    async def _env(self, path: str, payload: Any, cookies: dict[str, str], retry: RetryPolicy | None = None):
        """Call the environment; its 4xx about the row become our 4xx (the caller's input was bad)."""
        try:
            kwargs = {"retry": retry} if retry is not None else {}
            return await self.client.call(
                self.config.resources_server.name,
                path,
                payload,
                cookies=cookies,
                timeout_s=self.config.env_timeout_s,
                **kwargs,
            )
        except ServerCallError as exc:
            if path in ("/seed_session", "/reset") and exc.status in (400, 422):
                raise HTTPError(
                    exc.status, f"the environment rejected the row: {exc.detail}", "validation_error"
                ) from exc
            raise

    def _request_base(self, params: dict[str, Any]) -> dict[str, Any]:
        tools = [t for t in params.get("tools") or [] if isinstance(t, dict)]
        if self.config.action_mode == "tool" and not any(t.get("name") == ACTION_TOOL for t in tools):
            tools.append(action_tool_schema())
        return {**params, "tools": tools} if tools else {k: v for k, v in params.items() if k != "tools"}

    async def play(self, params: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """The episode loop; returns one Response holding the whole episode."""
        base = self._request_base(params)
        history = input_items(params)
        reset = (await self._env("/reset", {}, cookies)).json()
        output: list[dict[str, Any]] = [user_message(observation_text(reset.get("observation")))]
        usages: list[dict[str, Any] | None] = []
        model = ""
        done = False
        for _ in range(self.config.max_steps):
            reply = await self.call_model({**base, "input": history + output}, cookies)
            usages.append(reply.get("usage"))
            model = reply.get("model", model)
            items = [i for i in reply.get("output") or [] if isinstance(i, dict)]
            output.extend(items)
            observation, chosen, done = await self._act(items, cookies)
            for call in (item for item in items if item.get("type") == "function_call"):
                call_id = str(call.get("call_id", ""))
                answers = chosen is not None and call_id == chosen and observation is not None
                output.append(
                    function_call_output_item(call_id, observation if answers else _stray_call_error(call))
                )
            if chosen is None and observation is not None:
                output.append(user_message(observation))
            if done:
                break
        fields = {"status": "completed"} if done else ended_early(STEP_LIMIT)
        return new_response(output, model, sum_usage(usages), **fields)

    async def _act(
        self, items: list[dict[str, Any]], cookies: dict[str, str]
    ) -> tuple[str | None, str | None, bool]:
        """Step the turn's action: (observation text, call_id it answers or None, episode over).

        The observation is None when the turn took no action and only made calls to other tools:
        their error outputs already tell the model what to do.
        """
        turn = turn_action(items)
        if turn.action is None:
            if turn.call_id is not None:
                return f"Error: no action taken: {turn.error}", turn.call_id, False
            if any(item.get("type") == "function_call" for item in items):
                return None, None, False
            return f"Error: no action taken: {turn.error}.", None, False
        if len(turn.action) > MAX_ACTION_CHARS:
            return f"Error: the action is too long ({len(turn.action)} characters).", turn.call_id, False
        try:
            reply = await self._env("/step", {"action": turn.action}, cookies, retry=STEP_RETRY)
        except ServerCallError as exc:
            if exc.status is None or exc.status == 409 or exc.status >= 500:
                raise  # unreachable environment, lost session or a broken server: not the model's fault
            return f"Error: {exc.detail}", turn.call_id, False
        result = reply.json()
        done = bool(result.get("terminated") or result.get("truncated"))
        return observation_text(result.get("observation")), turn.call_id, done


def _stray_call_error(item: dict[str, Any]) -> str:
    if item.get("name") == ACTION_TOOL:
        return "Error: only the first act call of a turn is played; take one action per turn."
    name = item.get("name", "")
    return f"Error: there is no tool named '{name}'. Use the {ACTION_TOOL} tool to take an action."
