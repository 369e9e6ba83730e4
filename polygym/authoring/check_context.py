"""What the conformance checks share: one ``CheckContext`` and the few probes several checks make.

Each check of ``gym env check`` (``polygym.authoring.checks``) is a function of a ``CheckContext``.
The context holds the environment under test, its example rows, the ``Probe`` that calls the
served environment, and what earlier checks found that later ones build on: the tool listing (for
the tool checks), the rewards of the wrong and correct rollouts (compared by "correct beats
wrong"), and every verify reply (sent back to ``/aggregate_metrics``). The checks run in the
order the runner (``polygym.authoring.check``) lists them, so a check reads only what an earlier
one wrote.

The probes here are the ones several checks make: a whole rollout's verify (seed, replay the tool
calls, verify, end the session), a class's example solution, and a batch of malformed requests
that must all be answered with a 4xx and a message.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from polygym.authoring.probe import NOT_CALLED, Probe
from polygym.authoring.report import FAIL, PASS, SKIP, Outcome
from polygym.protocol import function_call_item, function_call_output_item, function_calls, message_item
from polygym.protocol import new_response as _new_response
from polygym.stack.environment import Environment

GARBAGE = "zqx vrk polygym-envcheck: an answer that cannot be right"


@dataclass
class CheckContext:
    """The environment under test and what the checks have found so far."""

    environment: Environment
    timeout_s: float
    max_rows: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The example dataset's usable rows (the dataset check reads them)."""
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The class's tool schemas by name (the tools check lists them)."""
    verified: list[dict[str, Any]] = field(default_factory=list)
    """Every verify reply, in order: the rollouts sent to ``/aggregate_metrics``."""
    wrong: list[float] = field(default_factory=list)
    """Per row, the best reward of a wrong rollout (NaN where one failed)."""
    correct: list[float] | None = None
    """Per row, the example solution's reward (NaN where none); None when the class has none."""
    http: Probe = field(init=False)
    """Calls to the served environment; set once it is serving."""

    def __post_init__(self) -> None:
        # Read now, so that a class that cannot be imported is a config failure before any check.
        self.low, self.high = self.environment.reward_range


def wrong_outputs(tool_names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rollouts no verifier should reward fully: nothing, garbage, broken tool calls."""
    broken = []
    for name, arguments in [*([(tool_names[0], "{not json")] if tool_names else []), ("no_such_tool", "{}")]:
        call = function_call_item(name, arguments)
        broken += [call, function_call_output_item(call["call_id"], f"error: bad call to {name}")]
    broken.append(message_item(GARBAGE))
    return {"empty output": [], "garbage answer": [message_item(GARBAGE)], "broken tool calls": broken}


def short(value: Any, limit: int = 80) -> str:
    """``value`` as compact JSON, cut at ``limit`` characters (for one line of a report)."""
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def outcome(problems: list[str], detail: str, limit: int = 4) -> Outcome:
    """PASS with ``detail``, or FAIL listing the problems (SKIP when an earlier hang stopped every call)."""
    if problems:
        more = f" (+{len(problems) - limit} more)" if len(problems) > limit else ""
        status = SKIP if all(NOT_CALLED in p for p in problems) else FAIL
        return status, "; ".join(problems[:limit]) + more
    return PASS, detail


async def verify_rollout(
    ctx: CheckContext, row: dict[str, Any], output: list[dict[str, Any]], replay: bool = False
) -> tuple[float | None, str]:
    """seed → (replay the output's tool calls) → verify → end_session: (reward, problem).

    A reward comes back only when it is a finite number inside the reward range; the verify reply
    is then kept in ``ctx.verified``.
    """
    cookie, problem = await ctx.http.seed(row)
    if cookie is None:
        return None, problem
    try:
        for call in function_calls(output) if replay else []:
            if call.name in ctx.tools and call.arguments is not None:
                reply = await ctx.http.request("POST", f"/{call.name}", call.arguments, cookie)
                if not reply.ok:
                    return None, f"replaying {call.name}: {reply.describe()}"
        # Fixed id and time: the same output gives byte-identical verify requests.
        response = _new_response(output, model="polygym-envcheck", id="resp_envcheck", created_at=0)
        reply = await ctx.http.request("POST", "/verify", {**row, "response": response}, cookie)
    finally:
        ended = await ctx.http.end(cookie)
    body = reply.json() if reply.ok else None
    reward = body.get("reward") if isinstance(body, dict) else None
    if not reply.ok:
        return None, f"verify: {reply.describe()}"
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return None, f"reward is not a finite number: {reward!r}"
    if not ctx.low <= reward <= ctx.high:
        return None, f"reward {reward:g} outside reward_range [{ctx.low:g}, {ctx.high:g}]"
    ctx.verified.append(body)  # type: ignore[arg-type]
    return reward, ended


async def example_solution(ctx: CheckContext, row: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    """The class's example solution for ``row`` (None when it knows none), or a problem."""
    try:
        output: Any = ctx.environment.server_class.example_solution(copy.deepcopy(row))
        if inspect.isawaitable(output):
            output = await output
    except Exception as exc:
        return None, f"example_solution raised {type(exc).__name__}: {exc}"
    if output is None:
        return None, ""
    if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
        return None, f"example_solution returned {type(output).__name__}, expected a list of output items"
    return output, ""


async def expect_4xx(
    ctx: CheckContext, path: str, cases: list[tuple[str, Any]], cookie: str | None
) -> Outcome:
    """POST each malformed body in ``cases`` to ``path``: every one must get a 4xx with a message."""
    problems, statuses = [], set()
    for label, body in cases:
        reply = await ctx.http.request("POST", path, body, cookie)
        if reply.status is not None and 400 <= reply.status < 500:
            statuses.add(reply.status)
            if not reply.message():
                problems.append(f"{label}: HTTP {reply.status} without a message")
        else:
            problems.append(f"{label}: expected a 4xx, got {reply.describe()}")
    codes = "/".join(str(s) for s in sorted(statuses))
    return outcome(problems, f"{len(cases)} malformed requests -> HTTP {codes} with a message")
