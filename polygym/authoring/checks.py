"""The conformance checks of ``gym env check``: one function per check.

Each takes the shared ``CheckContext`` (``polygym.authoring.check_context``) and returns an
``Outcome`` (status, detail); a check on one tool also takes the tool's name. Which checks run, in
which order and under which name is the runner's business (``polygym.authoring.check``), as is
timing them and turning a check that raises into a failure. A check may record in the context what
a later one needs (the rows, the tool listing, the rewards); the docstrings say so.

The first three need no server (config, dataset, a tool's schema); the rest call the served
environment through ``ctx.http``, in the order a rollout uses it.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

from polygym.authoring.check_context import (
    CheckContext,
    example_solution,
    expect_4xx,
    outcome,
    short,
    verify_rollout,
    wrong_outputs,
)
from polygym.authoring.report import FAIL, PASS, SKIP, WARN, Outcome
from polygym.collect.dataset import check_row, read_rows
from polygym.json_schema import example_arguments, schema_problems, validation_errors, wrong_type_cases
from polygym.jsonl import count_rows
from polygym.protocol import new_response
from polygym.servers.base import body_model

# ------------------------------------------------------------------------------- before serving


def config(ctx: CheckContext) -> Outcome:
    """The environment loaded: its class and reward range, warning with the loader's notes."""
    env = ctx.environment
    detail = f"{env.resources.name}: {env.server_class.__name__}, reward_range [{ctx.low:g}, {ctx.high:g}]"
    return (WARN if env.notes else PASS), "; ".join([detail, *env.notes])


def dataset(ctx: CheckContext) -> Outcome:
    """Up to ``ctx.max_rows`` usable rows of the example dataset, kept in ``ctx.rows``.

    Rows are read and shape-checked by ``polygym.collect.dataset``, as ``gym eval run`` reads them.
    """
    path, problem = ctx.environment.example_dataset()
    problems = [problem] if problem else []
    if path is None:
        return FAIL, "; ".join([*problems, "no example dataset to check with (data/example.jsonl)"])
    with contextlib.suppress(ValueError):  # shorter in messages
        path = path.resolve().relative_to(Path.cwd().resolve())
    for row in read_rows(path, problems, limit=ctx.max_rows):
        known = len(problems)
        check_row(row, problems)
        if len(problems) == known:
            ctx.rows.append(row.data)
    problems += [] if ctx.rows else ["no usable rows"]
    detail = f"{path}: {count_rows(path)} rows, checking {len(ctx.rows)}"
    return (FAIL, "; ".join([*problems, detail])) if problems else (PASS, detail)


def tool_schema(ctx: CheckContext, tool: str) -> Outcome:
    """The tool's schema is one a model can be offered: a description and an object JSON Schema."""
    schema = ctx.tools[tool]
    params = schema.get("parameters")
    problems = [] if isinstance(schema.get("description"), str) else ["description must be a string"]
    if not isinstance(params, dict) or params.get("type") != "object" or "properties" not in params:
        problems.append("parameters must be a JSON Schema with type: object and properties")
    else:
        problems += schema_problems(params)
    if problems:
        return FAIL, "; ".join(problems)
    if not schema.get("description"):
        return WARN, "valid, but no description: models need one (write a docstring)"
    return PASS, "valid JSON Schema object"


# ----------------------------------------------------------------------------------- served


async def liveness(ctx: CheckContext) -> Outcome:
    """``GET /`` answers status ok with the sessions stats."""
    reply = await ctx.http.request("GET", "/")
    health = reply.json() if reply.ok else None
    if not isinstance(health, dict) or health.get("status") != "ok":
        return FAIL, f"GET / -> {reply.describe()}"
    sessions = health.get("sessions")
    if not isinstance(sessions, dict) or "active" not in sessions:
        return FAIL, "GET / has no sessions stats (does health() call super()?)"
    return PASS, f"GET / -> status ok, {sessions['active']} active sessions"


async def tool_listing(ctx: CheckContext) -> Outcome:
    """``GET /tools`` serves the class's ``tool_schemas()``, which are kept in ``ctx.tools``."""
    declared = ctx.environment.server_class.tool_schemas()
    ctx.tools = {t["name"]: t for t in declared}
    reply = await ctx.http.request("GET", "/tools")
    served = reply.json() if reply.ok else None
    if served != declared:
        shown = reply.describe() if not reply.ok else short(served)
        return FAIL, f"GET /tools -> {shown}; expected the class's tool_schemas() {list(ctx.tools)}"
    return (
        PASS,
        f"{len(served)}: {', '.join(ctx.tools)}" if served else "none (a single-turn environment)",
    )


def no_rows(ctx: CheckContext) -> Outcome:
    """Stands for every rollout check when the dataset gave no row to run them on."""
    return SKIP, "no dataset rows to seed sessions and verify with"


def dataset_tools(ctx: CheckContext) -> Outcome:
    """The rows offer only tools the server has, with the schemas it serves."""
    unknown, differ = set(), set()
    for row in ctx.rows:
        for entry in row["responses_create_params"].get("tools") or []:
            name = entry.get("name") if isinstance(entry, dict) else None
            if name not in ctx.tools:
                unknown.add(str(name))
            elif entry != ctx.tools[name]:
                differ.add(name)
    if unknown:
        return FAIL, f"rows offer tools the server does not have: {', '.join(sorted(unknown))}"
    if differ:
        return WARN, f"rows' schemas differ from the served ones: {', '.join(sorted(differ))} (regenerate?)"
    return PASS, "rows offer only served tools, with the served schemas"


async def seed_sessions(ctx: CheckContext) -> Outcome:
    """Every row seeds a session, and ``/end_session`` releases it."""
    problems = []
    for index, row in enumerate(ctx.rows):
        cookie, problem = await ctx.http.seed(row)
        if problem or (problem := await ctx.http.end(cookie)):
            problems.append(f"row {index}: {problem}")
    return outcome(problems, f"{len(ctx.rows)} rows seeded and released")


def _parameters(ctx: CheckContext, tool: str) -> dict[str, Any]:
    declared = ctx.tools[tool].get("parameters")
    return declared if isinstance(declared, dict) else {}


async def tool_call(ctx: CheckContext, tool: str) -> Outcome:
    """A call with arguments valid by the tool's own schema answers 2xx with JSON."""
    parameters = _parameters(ctx, tool)
    arguments = example_arguments(parameters)
    if validation_errors(arguments, parameters):
        arguments = example_arguments(parameters, required_only=True)
    errors = validation_errors(arguments, parameters)
    if errors or not isinstance(arguments, dict):
        return SKIP, f"cannot synthesize valid arguments ({'; '.join(errors[:3]) or 'not an object'})"
    cookie, problem = await ctx.http.seed(ctx.rows[0])
    if cookie is None:
        return FAIL, problem
    reply = await ctx.http.request("POST", f"/{tool}", arguments, cookie)
    problem = "" if reply.ok else reply.describe()
    if reply.ok and reply.body and reply.json() is None:
        problem = "answered 2xx with a body that is not JSON"
    ended = await ctx.http.end(cookie)
    problem = problem or ended
    return outcome(
        [f"{short(arguments)}: {problem}"] if problem else [], f"{short(arguments)} -> HTTP {reply.status}"
    )


async def tool_bad_input(ctx: CheckContext, tool: str) -> Outcome:
    """Malformed arguments (bad JSON, not an object, missing or mistyped fields) get a 4xx, never a 5xx."""
    parameters = _parameters(ctx, tool)
    valid = example_arguments(parameters)
    cases: list[tuple[str, Any]] = [
        ("invalid JSON", b'{"oops": '),
        ("not an object", b'["not", "an object"]'),
    ]
    if parameters.get("required"):
        cases.append(("missing required fields", {}))
    cases += wrong_type_cases(parameters, valid if isinstance(valid, dict) else {})
    cookie, problem = await ctx.http.seed(ctx.rows[0])
    if cookie is None:
        return FAIL, problem
    result = await expect_4xx(ctx, f"/{tool}", cases, cookie)
    problem = await ctx.http.end(cookie)
    return (FAIL, problem) if problem else result


async def episode_protocol(ctx: CheckContext) -> Outcome:
    """Reset/step environments: the Gymnasium-style protocol answers as documented."""
    cookie, problem = await ctx.http.seed(ctx.rows[0])
    if cookie is None:
        return FAIL, problem
    problems = []
    early = await ctx.http.request("POST", "/step", {"action": "1"}, cookie)
    if early.status != 409:
        problems.append(f"/step before /reset: expected 409, got {early.describe()}")
    reset = await ctx.http.request("POST", "/reset", {}, cookie)
    if not reset.ok or not isinstance(reset.json(), dict) or "observation" not in reset.json():
        problems.append(f"/reset: expected 2xx with an observation, got {reset.describe()}")
    bad = await ctx.http.request("POST", "/step", {"not_action": 1}, cookie)
    if bad.status is None or not 400 <= bad.status < 500:
        problems.append(f"/step without an action: expected a 4xx, got {bad.describe()}")
    stepped = await ctx.http.request("POST", "/step", {"action": "1"}, cookie)
    reply = stepped.json() if stepped.ok else None
    if not isinstance(reply, dict):
        problems.append(f"/step: expected 2xx with a JSON object, got {stepped.describe()}")
    else:
        reward = reply.get("reward")
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            problems.append(f"/step: reward {reward!r} is not a finite number")
        if not isinstance(reply.get("terminated"), bool) or not isinstance(reply.get("truncated"), bool):
            problems.append("/step: terminated and truncated must be booleans")
    ended = await ctx.http.end(cookie)
    return outcome([*problems, *([ended] if ended else [])], "409 before reset, reset, 4xx on bad step, step")


async def wrong_rollouts(ctx: CheckContext) -> Outcome:
    """Every wrong rollout of every row verifies to a reward in range (the best per row: ``ctx.wrong``)."""
    problems = []
    outputs = wrong_outputs(list(ctx.tools))
    for index, row in enumerate(ctx.rows):
        rewards = []
        for label, output in outputs.items():
            reward, problem = await verify_rollout(ctx, row, output)
            if problem:
                problems.append(f"row {index}, {label}: {problem}")
            rewards.append(math.nan if reward is None else reward)
        ctx.wrong.append(math.nan if any(math.isnan(r) for r in rewards) else max(rewards))
    shown = ", ".join(f"{r:g}" for r in ctx.wrong)
    return outcome(problems, f"{len(outputs)} kinds per row, in range (best wrong reward per row: {shown})")


async def correct_rollouts(ctx: CheckContext) -> Outcome:
    """Verify each row's example solution (kept in ``ctx.correct``); rows without one are skipped."""
    problems, correct = [], []
    for index, row in enumerate(ctx.rows):
        output, problem = await example_solution(ctx, row)
        reward = None
        if output is not None:
            reward, problem = await verify_rollout(ctx, row, output, replay=True)
        correct.append(math.nan if reward is None or problem else reward)
        if problem:
            problems.append(f"row {index}: {problem}")
    if not problems and all(math.isnan(r) for r in correct):
        cls = ctx.environment.server_class.__name__
        return SKIP, (
            f"no example_solution: override `@classmethod example_solution(cls, row) -> list[output "
            f"items]` in {cls} to check that a correct answer is rewarded"
        )
    ctx.correct = correct
    return outcome(problems, "rewards " + ", ".join(f"{r:g}" for r in correct))


def correct_beats_wrong(ctx: CheckContext) -> Outcome:
    """On every row with both rewards, the example solution earns more than any wrong rollout."""
    if ctx.correct is None:
        return SKIP, "no example_solution"
    pairs = [(i, c, w) for i, (c, w) in enumerate(zip(ctx.correct, ctx.wrong, strict=False))]
    usable = [(i, c, w) for i, c, w in pairs if not (math.isnan(c) or math.isnan(w))]
    if not usable:
        return SKIP, "no row has both rewards (see the failures above)"
    bad = [f"row {i}: correct {c:g} <= wrong {w:g}" for i, c, w in usable if not c > w]
    return outcome(bad, f"{len(usable)} rows: the correct rollout beats every wrong one")


async def deterministic(ctx: CheckContext) -> Outcome:
    """The same rollout verified twice gets the same reward (and, ideally, the same reply)."""
    row, label = ctx.rows[0], "example solution"
    solved = ctx.correct and not math.isnan(ctx.correct[0])
    output, problem = await example_solution(ctx, row) if solved else (None, "no solution")
    if problem or output is None:
        output, label = wrong_outputs(list(ctx.tools))["garbage answer"], "garbage answer"
    before = len(ctx.verified)
    replay = label == "example solution"
    first, problem = await verify_rollout(ctx, row, output, replay)
    second, problem = (None, problem) if problem else await verify_rollout(ctx, row, output, replay)
    if first is None or second is None:
        return SKIP, f"verify failed: {problem}"
    if first != second:
        return FAIL, f"same input, rewards {first:g} then {second:g}"
    one, two = ctx.verified[before], ctx.verified[before + 1]
    differ = sorted(k for k in set(one) | set(two) if one.get(k) != two.get(k))
    if differ:
        return WARN, f"same reward, other fields differ: {', '.join(differ)}"
    return PASS, f"row 0 ({label}) verified twice: identical results"


async def verify_bad_input(ctx: CheckContext) -> Outcome:
    """Malformed verify requests (and rows missing the class's own fields) get a 4xx, never a 5xx."""
    cases: list[tuple[str, Any]] = [
        ("invalid JSON", b'{"responses_create_params": '),
        ("not an object", b"[1, 2, 3]"),
        ("missing fields", {}),
        ("wrong types", {"responses_create_params": "not an object", "response": 42}),
    ]
    model = body_model(ctx.environment.server_class.verify)
    required = set(model.model_json_schema().get("required") or []) if model else set()
    own = sorted(required - {"responses_create_params", "response"})
    if own:
        params = ctx.rows[0].get("responses_create_params")
        bare = {"responses_create_params": params, "response": new_response([], model="x")}
        cases.append((f"row without {', '.join(own)}", bare))
    return await expect_4xx(ctx, "/verify", cases, None)


async def aggregate_metrics(ctx: CheckContext) -> Outcome:
    """``/aggregate_metrics`` of every verified rollout answers a JSON object."""
    if not ctx.verified:
        return SKIP, "no verified rollouts"
    reply = await ctx.http.request("POST", "/aggregate_metrics", {"rollouts": ctx.verified})
    metrics = reply.json() if reply.ok else None
    if not isinstance(metrics, dict):
        return FAIL, reply.describe() if not reply.ok else "did not answer a JSON object"
    return PASS, f"{len(ctx.verified)} verified rollouts -> {len(metrics)} metrics"


async def sessions_released(ctx: CheckContext) -> Outcome:
    """Every session the checks seeded was released, and none is left active."""
    reply = await ctx.http.request("GET", "/")
    health = reply.json() if reply.ok else None
    sessions = health.get("sessions") if isinstance(health, dict) else None
    if not isinstance(sessions, dict):
        return FAIL, f"GET / -> {reply.describe()}" if not reply.ok else "GET / has no sessions stats"
    seeded, released, active = ctx.http.seeded, ctx.http.released, sessions.get("active")
    detail = f"{seeded} sessions seeded, {released} released by end_session, {active} active"
    return (PASS if active == 0 and seeded == released else FAIL), detail
