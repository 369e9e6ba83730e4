"""simple_agent: seed a session, loop model call -> tool calls until the model answers, verify.

The loop never lets one bad turn end an episode: arguments that are not a JSON object, an unknown
tool or a tool that fails all go back to the model as the tool's output text, the way a person
debugging the policy would want to read them. Infrastructure failures (a server down, a timeout)
are different: they abort the rollout with an error so the collector records a failure. The
session is released in every case, so a long run does not leak environment state.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from polygym import (
    STEP_LIMIT,
    Agent,
    AgentConfig,
    RetryPolicy,
    ServerCallError,
    ended_early,
    function_call_output_item,
    input_items,
    new_response,
    sum_usage,
)

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# A tool call may change state, so only retry when the request provably never arrived.
TOOL_RETRY = RetryPolicy(attempts=3, retry_statuses=frozenset({429, 503}), retry_after_send=False)


class SimpleAgentConfig(AgentConfig):
    max_steps: int = 10
    tool_timeout_s: float = 120.0
    """One tool call, and seed_session."""


class SimpleAgent(Agent[SimpleAgentConfig]):
    async def seed_session(self, row: dict[str, Any]) -> dict[str, str]:
        reply = await self.client.call(
            self.config.resources_server.name, "/seed_session", row, timeout_s=self.config.tool_timeout_s
        )
        return dict(reply.cookies)

    async def play(self, params: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """The model/tool loop; returns one Response holding every generated item and tool output."""
        history = input_items(params)
        offered = {t.get("name") for t in params.get("tools") or [] if isinstance(t, dict)}
        output: list[dict[str, Any]] = []
        usages: list[dict[str, Any] | None] = []
        last: dict[str, Any] = {}
        truncated = False
        for step in range(self.config.max_steps):
            last = await self.call_model({**params, "input": history + output}, cookies)
            usages.append(last.get("usage"))
            items = last.get("output") or []
            output.extend(items)
            calls = [item for item in items if item.get("type") == "function_call"]
            if not calls or last.get("status") == "incomplete":
                break
            for call in calls:
                text = await self._run_tool(call, offered, cookies)
                output.append(function_call_output_item(str(call.get("call_id", "")), text))
            truncated = step == self.config.max_steps - 1
        fields = ended_early(STEP_LIMIT) if truncated else {"status": last.get("status", "completed")}
        return new_response(output, last.get("model", ""), sum_usage(usages), **fields)

    async def _run_tool(self, call: dict[str, Any], offered: set[Any], cookies: dict[str, str]) -> str:
        """Execute one function call; anything the model got wrong comes back as text for it."""
        name = str(call.get("name", ""))
        if name not in offered or not TOOL_NAME.match(name):
            available = ", ".join(sorted(map(str, offered)))
            return f"Error: there is no tool named '{name}'. Available tools: {available}"
        try:
            arguments = orjson.loads(call.get("arguments") or "{}")
        except orjson.JSONDecodeError as exc:
            return f"Error: the arguments of {name} are not valid JSON ({exc}). Send a JSON object."
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}."
        try:
            reply = await self.client.call(
                self.config.resources_server.name,
                f"/{name}",
                arguments,
                cookies=cookies,
                timeout_s=self.config.tool_timeout_s,
                retry=TOOL_RETRY,
            )
        except ServerCallError as exc:
            if exc.status is None or exc.status == 409:
                raise  # the environment is unreachable or lost the session: not the model's fault
            return f"Error: {name} failed: {exc.detail}"
        cookies.update(reply.cookies)
        return reply.body.decode()
