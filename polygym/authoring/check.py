"""Conformance checks for one environment (``gym env check``), as a Python API.

In the spirit of Gymnasium's ``check_env``: start the environment alone and probe every part of the
contract a rollout relies on, so an author learns about a broken tool or verifier before a training
run does. ``check_env(name)`` (or a folder, or the server class itself) returns an ``EnvReport`` of
``CheckResult``s (pass / fail / warn / skip); only a *fail* makes ``report.ok`` false.

How the environment is started, and why:

* Only the resources server runs (no agent, no model), loaded by ``polygym.stack.environment`` exactly
  as ``gym env start`` would load it, and its example dataset found as every other command finds
  an environment's datasets.
* The server is served on a real loopback socket from a ``ThreadServer``: a **thread with its own
  event loop**. Over a socket the checker sees what agents see (status codes, cookies, bodies); in
  its own thread a verifier that blocks its event loop cannot block the checker's timeouts. Every
  call has a timeout, an endpoint that timed out once is not called again (so a hanging verify
  costs one timeout, not one per row), and start and stop are bounded too.

A correct rollout comes from the server class's classmethod ``example_solution(row)`` (declared
on ``ResourcesServer``, returning None unless overridden), the output items of a rollout that
deserves the top reward; its function calls are replayed against the tools in the rollout's
session before verify, so stateful environments see what a real rollout would have done. Without
one the correct-rollout checks are skipped (and say how to enable them); the wrong rollouts are
always checked. Tool arguments, valid and wrong, come from each tool's JSON Schema
(``polygym.json_schema``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from polygym.authoring.probe import NOT_CALLED, Probe
from polygym.authoring.report import FAIL, PASS, SKIP, WARN, CheckResult, EnvReport, Outcome
from polygym.collect.dataset import check_row, read_rows
from polygym.json_schema import (
    example_arguments,
    schema_problems,
    validation_errors,
    wrong_type_cases,
)
from polygym.jsonl import count_rows
from polygym.net.client import ServerClient
from polygym.net.thread_server import StartupError, ThreadServer
from polygym.protocol import (
    MODEL_KIND,
    function_call_item,
    function_call_output_item,
    function_calls,
    message_item,
)
from polygym.protocol import new_response as _new_response
from polygym.servers.base import body_model
from polygym.servers.episodic import EpisodicServer
from polygym.servers.resources import ResourcesServer
from polygym.stack import catalog
from polygym.stack.config import ConfigError, load_config
from polygym.stack.environment import (
    STUB_MODEL,
    Environment,
    describe_environment,
    load_environment,
    resolve_env_dir,
)
from polygym.stack.loader import build_server

# The report types (polygym.authoring.report) and environment loading (polygym.stack.environment) are
# re-exported: `gym env check`, `gym list environments` and scripts import them from here.
__all__ = [
    "DEFAULT_MAX_ROWS",
    "DEFAULT_TIMEOUT_S",
    "FAIL",
    "PASS",
    "SKIP",
    "WARN",
    "CheckResult",
    "EnvReport",
    "check_env",
    "check_env_async",
    "describe_environment",
    "load_environment",
    "resolve_env_dir",
    "wrong_outputs",
]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 3
GARBAGE = "zqx vrk polygym-envcheck: an answer that cannot be right"
_GRACEFUL_S = 0.5


# ------------------------------------------------------------------------------------------ checking


def wrong_outputs(tool_names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rollouts no verifier should reward fully: nothing, garbage, broken tool calls."""
    broken = []
    for name, arguments in [*([(tool_names[0], "{not json")] if tool_names else []), ("no_such_tool", "{}")]:
        call = function_call_item(name, arguments)
        broken += [call, function_call_output_item(call["call_id"], f"error: bad call to {name}")]
    broken.append(message_item(GARBAGE))
    return {"empty output": [], "garbage answer": [message_item(GARBAGE)], "broken tool calls": broken}


def _short(value: Any, limit: int = 80) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def _failure(exc: BaseException, timeout_s: float, what: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"{what} did not finish within {timeout_s:g}s"
    if isinstance(exc, StartupError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _outcome(problems: list[str], detail: str, limit: int = 4) -> Outcome:
    """PASS with ``detail``, or FAIL listing the problems (SKIP when an earlier hang stopped every call)."""
    if problems:
        more = f" (+{len(problems) - limit} more)" if len(problems) > limit else ""
        status = SKIP if all(NOT_CALLED in p for p in problems) else FAIL
        return status, "; ".join(problems[:limit]) + more
    return PASS, detail


class _Checker:
    """The checks that need the served environment, in the order a rollout uses it."""

    def __init__(self, environment: Environment, report: EnvReport, timeout_s: float) -> None:
        self.environment = environment
        self.report = report
        self.timeout_s = timeout_s
        self.low, self.high = environment.reward_range
        self.rows: list[dict[str, Any]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.verified: list[dict[str, Any]] = []
        self.http: Probe
        self.wrong: list[float] = []
        self.correct: list[float] | None = None

    async def step(self, name: str, check: Any) -> None:
        """Run one check coroutine and record its outcome with its duration."""
        began = time.perf_counter()
        try:
            status, detail = await check
        except Exception as exc:  # a checker bug must not hide the other results
            status, detail = FAIL, f"the check itself failed: {type(exc).__name__}: {exc}"
        self.report.results.append(CheckResult(name, status, detail, time.perf_counter() - began))

    def record(self, name: str, outcome: Outcome) -> None:
        self.report.results.append(CheckResult(name, *outcome))

    # -- the whole run ----------------------------------------------------------------------
    async def run(self, max_rows: int) -> None:
        self.record("config", self.config())
        self.rows, outcome = _load_rows(self.environment, max_rows)
        self.record("dataset", outcome)
        began = time.perf_counter()
        runner: ThreadServer | None = None
        try:
            server = self.environment.build()
            models = serve_model_stand_ins(self.environment, server.client)
            if models is not None:
                self.record("model servers", models)
            runner = ThreadServer(server.app, server.client, _GRACEFUL_S)
            await runner.start(self.timeout_s)
        except Exception as exc:
            detail = _failure(exc, self.timeout_s, "startup")
            self.report.results.append(CheckResult("start", FAIL, detail, time.perf_counter() - began))
            if runner is not None:
                with contextlib.suppress(Exception):
                    await runner.stop(self.timeout_s + _GRACEFUL_S + 1.0)
            return
        self.report.results.append(
            CheckResult("start", PASS, f"serving on {runner.url}", time.perf_counter() - began)
        )
        self.http = Probe(runner.url, self.timeout_s)
        try:
            await self.served()
        finally:
            await self.http.close()
            await self.step("shutdown", self.shutdown(runner))

    async def served(self) -> None:
        await self.step("liveness", self.liveness())
        await self.step("tools", self.tool_listing())
        for name, schema in self.tools.items():
            self.record(f"tool {name}: schema", self.tool_schema(schema))
        if not self.rows:
            self.record("rollouts", (SKIP, "no dataset rows to seed sessions and verify with"))
            return
        self.record("dataset tools", self.dataset_tools())
        await self.step("seed_session", self.seed_sessions())
        for name, schema in self.tools.items():
            await self.step(f"tool {name}: call", self.tool_call(name, schema))
            await self.step(f"tool {name}: bad input", self.tool_bad_input(name, schema))
        if issubclass(self.environment.server_class, EpisodicServer):
            await self.step("episode: reset/step", self.episode_protocol())
        await self.step("verify: wrong rollouts", self.wrong_rollouts())
        await self.step("verify: correct rollout", self.correct_rollouts())
        self.record("verify: correct beats wrong", self.correct_beats_wrong())
        await self.step("verify: deterministic", self.deterministic())
        await self.step("verify: bad input", self.verify_bad_input())
        await self.step("aggregate_metrics", self.aggregate())
        await self.step("sessions released", self.sessions_released())

    # -- before serving ---------------------------------------------------------------------
    def config(self) -> Outcome:
        env = self.environment
        detail = (
            f"{env.resources.name}: {env.server_class.__name__}, reward_range [{self.low:g}, {self.high:g}]"
        )
        return (WARN if env.notes else PASS), "; ".join([detail, *env.notes])

    def tool_schema(self, schema: dict[str, Any]) -> Outcome:
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

    def dataset_tools(self) -> Outcome:
        unknown, differ = set(), set()
        for row in self.rows:
            for entry in row["responses_create_params"].get("tools") or []:
                name = entry.get("name") if isinstance(entry, dict) else None
                if name not in self.tools:
                    unknown.add(str(name))
                elif entry != self.tools[name]:
                    differ.add(name)
        if unknown:
            return FAIL, f"rows offer tools the server does not have: {', '.join(sorted(unknown))}"
        if differ:
            return (
                WARN,
                f"rows' schemas differ from the served ones: {', '.join(sorted(differ))} (regenerate?)",
            )
        return PASS, "rows offer only served tools, with the served schemas"

    # -- served -----------------------------------------------------------------------------
    async def liveness(self) -> Outcome:
        reply = await self.http.request("GET", "/")
        health = reply.json() if reply.ok else None
        if not isinstance(health, dict) or health.get("status") != "ok":
            return FAIL, f"GET / -> {reply.describe()}"
        sessions = health.get("sessions")
        if not isinstance(sessions, dict) or "active" not in sessions:
            return FAIL, "GET / has no sessions stats (does health() call super()?)"
        return PASS, f"GET / -> status ok, {sessions['active']} active sessions"

    async def tool_listing(self) -> Outcome:
        declared = self.environment.server_class.tool_schemas()
        self.tools = {t["name"]: t for t in declared}
        reply = await self.http.request("GET", "/tools")
        served = reply.json() if reply.ok else None
        if served != declared:
            shown = reply.describe() if not reply.ok else _short(served)
            return FAIL, f"GET /tools -> {shown}; expected the class's tool_schemas() {list(self.tools)}"
        return (
            PASS,
            f"{len(served)}: {', '.join(self.tools)}" if served else "none (a single-turn environment)",
        )

    async def verify(
        self, row: dict[str, Any], output: list[dict[str, Any]], replay: bool = False
    ) -> tuple[float | None, str]:
        """seed → (replay the output's tool calls) → verify → end_session: (reward, problem)."""
        cookie, problem = await self.http.seed(row)
        if cookie is None:
            return None, problem
        try:
            for call in function_calls(output) if replay else []:
                if call.name in self.tools and call.arguments is not None:
                    reply = await self.http.request("POST", f"/{call.name}", call.arguments, cookie)
                    if not reply.ok:
                        return None, f"replaying {call.name}: {reply.describe()}"
            # Fixed id and time: the same output gives byte-identical verify requests.
            response = _new_response(output, model="polygym-envcheck", id="resp_envcheck", created_at=0)
            reply = await self.http.request("POST", "/verify", {**row, "response": response}, cookie)
        finally:
            ended = await self.http.end(cookie)
        body = reply.json() if reply.ok else None
        reward = body.get("reward") if isinstance(body, dict) else None
        if not reply.ok:
            return None, f"verify: {reply.describe()}"
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            return None, f"reward is not a finite number: {reward!r}"
        if not self.low <= reward <= self.high:
            return None, f"reward {reward:g} outside reward_range [{self.low:g}, {self.high:g}]"
        self.verified.append(body)  # type: ignore[arg-type]
        return reward, ended

    async def seed_sessions(self) -> Outcome:
        problems = []
        for index, row in enumerate(self.rows):
            cookie, problem = await self.http.seed(row)
            if problem or (problem := await self.http.end(cookie)):
                problems.append(f"row {index}: {problem}")
        return _outcome(problems, f"{len(self.rows)} rows seeded and released")

    async def tool_call(self, name: str, schema: dict[str, Any]) -> Outcome:
        declared = schema.get("parameters")
        parameters: dict[str, Any] = declared if isinstance(declared, dict) else {}
        arguments = example_arguments(parameters)
        if validation_errors(arguments, parameters):
            arguments = example_arguments(parameters, required_only=True)
        errors = validation_errors(arguments, parameters)
        if errors or not isinstance(arguments, dict):
            return SKIP, f"cannot synthesize valid arguments ({'; '.join(errors[:3]) or 'not an object'})"
        cookie, problem = await self.http.seed(self.rows[0])
        if cookie is None:
            return FAIL, problem
        reply = await self.http.request("POST", f"/{name}", arguments, cookie)
        problem = "" if reply.ok else reply.describe()
        if reply.ok and reply.body and reply.json() is None:
            problem = "answered 2xx with a body that is not JSON"
        ended = await self.http.end(cookie)
        problem = problem or ended
        return _outcome(
            [f"{_short(arguments)}: {problem}"] if problem else [],
            f"{_short(arguments)} -> HTTP {reply.status}",
        )

    async def tool_bad_input(self, name: str, schema: dict[str, Any]) -> Outcome:
        declared = schema.get("parameters")
        parameters: dict[str, Any] = declared if isinstance(declared, dict) else {}
        valid = example_arguments(parameters)
        cases: list[tuple[str, Any]] = [
            ("invalid JSON", b'{"oops": '),
            ("not an object", b'["not", "an object"]'),
        ]
        if parameters.get("required"):
            cases.append(("missing required fields", {}))
        cases += wrong_type_cases(parameters, valid if isinstance(valid, dict) else {})
        cookie, problem = await self.http.seed(self.rows[0])
        if cookie is None:
            return FAIL, problem
        outcome = await self._expect_4xx(f"/{name}", cases, cookie)
        problem = await self.http.end(cookie)
        return (FAIL, problem) if problem else outcome

    async def _expect_4xx(self, path: str, cases: list[tuple[str, Any]], cookie: str | None) -> Outcome:
        problems, statuses = [], set()
        for label, body in cases:
            reply = await self.http.request("POST", path, body, cookie)
            if reply.status is not None and 400 <= reply.status < 500:
                statuses.add(reply.status)
                if not reply.message():
                    problems.append(f"{label}: HTTP {reply.status} without a message")
            else:
                problems.append(f"{label}: expected a 4xx, got {reply.describe()}")
        codes = "/".join(str(s) for s in sorted(statuses))
        return _outcome(problems, f"{len(cases)} malformed requests -> HTTP {codes} with a message")

    async def episode_protocol(self) -> Outcome:
        """Reset/step environments: the Gymnasium-style protocol answers as documented."""
        cookie, problem = await self.http.seed(self.rows[0])
        if cookie is None:
            return FAIL, problem
        problems = []
        early = await self.http.request("POST", "/step", {"action": "1"}, cookie)
        if early.status != 409:
            problems.append(f"/step before /reset: expected 409, got {early.describe()}")
        reset = await self.http.request("POST", "/reset", {}, cookie)
        if not reset.ok or not isinstance(reset.json(), dict) or "observation" not in reset.json():
            problems.append(f"/reset: expected 2xx with an observation, got {reset.describe()}")
        bad = await self.http.request("POST", "/step", {"not_action": 1}, cookie)
        if bad.status is None or not 400 <= bad.status < 500:
            problems.append(f"/step without an action: expected a 4xx, got {bad.describe()}")
        stepped = await self.http.request("POST", "/step", {"action": "1"}, cookie)
        reply = stepped.json() if stepped.ok else None
        if not isinstance(reply, dict):
            problems.append(f"/step: expected 2xx with a JSON object, got {stepped.describe()}")
        else:
            reward = reply.get("reward")
            if not isinstance(reward, int | float) or not math.isfinite(reward):
                problems.append(f"/step: reward {reward!r} is not a finite number")
            if not isinstance(reply.get("terminated"), bool) or not isinstance(reply.get("truncated"), bool):
                problems.append("/step: terminated and truncated must be booleans")
        ended = await self.http.end(cookie)
        return _outcome(
            [*problems, *([ended] if ended else [])], "409 before reset, reset, 4xx on bad step, step"
        )

    async def wrong_rollouts(self) -> Outcome:
        problems = []
        outputs = wrong_outputs(list(self.tools))
        for index, row in enumerate(self.rows):
            rewards = []
            for label, output in outputs.items():
                reward, problem = await self.verify(row, output)
                if problem:
                    problems.append(f"row {index}, {label}: {problem}")
                rewards.append(math.nan if reward is None else reward)
            self.wrong.append(math.nan if any(math.isnan(r) for r in rewards) else max(rewards))
        shown = ", ".join(f"{r:g}" for r in self.wrong)
        return _outcome(
            problems, f"{len(outputs)} kinds per row, in range (best wrong reward per row: {shown})"
        )

    async def correct_rollouts(self) -> Outcome:
        """Verify each row's example solution; rows whose solution is None (not known) are skipped."""
        problems, correct = [], []
        for index, row in enumerate(self.rows):
            output, problem = await self._solution(row)
            reward = None
            if output is not None:
                reward, problem = await self.verify(row, output, replay=True)
            correct.append(math.nan if reward is None or problem else reward)
            if problem:
                problems.append(f"row {index}: {problem}")
        if not problems and all(math.isnan(r) for r in correct):
            cls = self.environment.server_class.__name__
            return SKIP, (
                f"no example_solution: override `@classmethod example_solution(cls, row) -> list[output "
                f"items]` in {cls} to check that a correct answer is rewarded"
            )
        self.correct = correct
        return _outcome(problems, "rewards " + ", ".join(f"{r:g}" for r in correct))

    async def _solution(self, row: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
        """The class's example solution for ``row`` (None when it knows none), or a problem."""
        try:
            output: Any = self.environment.server_class.example_solution(copy.deepcopy(row))
            if inspect.isawaitable(output):
                output = await output
        except Exception as exc:
            return None, f"example_solution raised {type(exc).__name__}: {exc}"
        if output is None:
            return None, ""
        if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
            return None, f"example_solution returned {type(output).__name__}, expected a list of output items"
        return output, ""

    def correct_beats_wrong(self) -> Outcome:
        if self.correct is None:
            return SKIP, "no example_solution"
        pairs = [(i, c, w) for i, (c, w) in enumerate(zip(self.correct, self.wrong, strict=False))]
        usable = [(i, c, w) for i, c, w in pairs if not (math.isnan(c) or math.isnan(w))]
        if not usable:
            return SKIP, "no row has both rewards (see the failures above)"
        bad = [f"row {i}: correct {c:g} <= wrong {w:g}" for i, c, w in usable if not c > w]
        return _outcome(bad, f"{len(usable)} rows: the correct rollout beats every wrong one")

    async def deterministic(self) -> Outcome:
        row, label = self.rows[0], "example solution"
        solved = self.correct and not math.isnan(self.correct[0])
        output, problem = await self._solution(row) if solved else (None, "no solution")
        if problem or output is None:
            output, label = wrong_outputs(list(self.tools))["garbage answer"], "garbage answer"
        before = len(self.verified)
        replay = label == "example solution"
        first, problem = await self.verify(row, output, replay)
        second, problem = (None, problem) if problem else await self.verify(row, output, replay)
        if first is None or second is None:
            return SKIP, f"verify failed: {problem}"
        if first != second:
            return FAIL, f"same input, rewards {first:g} then {second:g}"
        one, two = self.verified[before], self.verified[before + 1]
        differ = sorted(k for k in set(one) | set(two) if one.get(k) != two.get(k))
        if differ:
            return WARN, f"same reward, other fields differ: {', '.join(differ)}"
        return PASS, f"row 0 ({label}) verified twice: identical results"

    async def verify_bad_input(self) -> Outcome:
        cases: list[tuple[str, Any]] = [
            ("invalid JSON", b'{"responses_create_params": '),
            ("not an object", b"[1, 2, 3]"),
            ("missing fields", {}),
            ("wrong types", {"responses_create_params": "not an object", "response": 42}),
        ]
        model = body_model(self.environment.server_class.verify)
        required = set(model.model_json_schema().get("required") or []) if model else set()
        own = sorted(required - {"responses_create_params", "response"})
        if own:
            params = self.rows[0].get("responses_create_params")
            bare = {"responses_create_params": params, "response": _new_response([], model="x")}
            cases.append((f"row without {', '.join(own)}", bare))
        return await self._expect_4xx("/verify", cases, None)

    async def aggregate(self) -> Outcome:
        if not self.verified:
            return SKIP, "no verified rollouts"
        reply = await self.http.request("POST", "/aggregate_metrics", {"rollouts": self.verified})
        metrics = reply.json() if reply.ok else None
        if not isinstance(metrics, dict):
            return FAIL, reply.describe() if not reply.ok else "did not answer a JSON object"
        return PASS, f"{len(self.verified)} verified rollouts -> {len(metrics)} metrics"

    async def sessions_released(self) -> Outcome:
        reply = await self.http.request("GET", "/")
        health = reply.json() if reply.ok else None
        sessions = health.get("sessions") if isinstance(health, dict) else None
        if not isinstance(sessions, dict):
            return FAIL, f"GET / -> {reply.describe()}" if not reply.ok else "GET / has no sessions stats"
        seeded, released, active = self.http.seeded, self.http.released, sessions.get("active")
        detail = f"{seeded} sessions seeded, {released} released by end_session, {active} active"
        return (PASS if active == 0 and seeded == released else FAIL), detail

    async def shutdown(self, runner: ThreadServer) -> Outcome:
        limit = self.timeout_s + _GRACEFUL_S + 1.0  # in-flight requests get _GRACEFUL_S, then are cancelled
        try:
            await runner.stop(limit)
        except Exception as exc:
            return FAIL, _failure(exc, limit, "shutdown") + " (a blocked event loop?)"
        return PASS, "stopped cleanly"


def serve_model_stand_ins(environment: Environment, client: ServerClient) -> Outcome | None:
    """Serve the scripted model, in process, under each model server the environment itself calls.

    An environment whose verifier asks a judge (``judge_model_server``) cannot be checked alone;
    the scripted model with its shipped rules plays every such server, so the checks exercise the
    verifier's real path to a model, deterministically and with no network. None when there are none.
    """
    names = sorted({name for _, kind, name in environment.resources.references() if kind == MODEL_KIND})
    if not names:
        return None
    shipped = catalog.find_implementation_dir(MODEL_KIND, STUB_MODEL) / "configs" / f"{STUB_MODEL}.yaml"
    spec = load_config([shipped]).by_kind(MODEL_KIND)[0]
    for name in names:
        model = build_server(replace(spec, name=name), client)
        client.add_local(name, model.app, model.dispatch)
    return PASS, f"{', '.join(names)}: played by {STUB_MODEL} with its shipped rules, in process"


def _load_rows(environment: Environment, max_rows: int) -> tuple[list[dict[str, Any]], Outcome]:
    """Up to ``max_rows`` rows of the example dataset, and the outcome of the dataset check.

    Rows are read and shape-checked by ``polygym.collect.dataset``, as ``gym eval run`` reads them.
    """
    path, problem = environment.example_dataset()
    problems = [problem] if problem else []
    if path is None:
        return [], (FAIL, "; ".join([*problems, "no example dataset to check with (data/example.jsonl)"]))
    with contextlib.suppress(ValueError):  # shorter in messages
        path = path.resolve().relative_to(Path.cwd().resolve())
    rows = []
    for row in read_rows(path, problems, limit=max_rows):
        known = len(problems)
        check_row(row, problems)
        if len(problems) == known:
            rows.append(row.data)
    total = count_rows(path)
    problems += [] if rows else ["no usable rows"]
    detail = f"{path}: {total} rows, checking {len(rows)}"
    return rows, ((FAIL, "; ".join([*problems, detail])) if problems else (PASS, detail))


def _env_folder(server_class: type[ResourcesServer]) -> Path:
    """The environment folder a server class was loaded from: the folder of its module's file."""
    try:
        return Path(inspect.getfile(server_class)).resolve().parent
    except TypeError:  # its module is not in sys.modules, or has no file
        raise TypeError(
            f"cannot find the folder of {server_class.__qualname__}: module {server_class.__module__!r} "
            "is not an imported file; pass the environment's folder instead"
        ) from None


async def check_env_async(
    env: str | Path | type[ResourcesServer],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> EnvReport:
    """Run every check on ``env``: a name, a folder, or a server class (checked as its folder,
    with the folder's config and example data, as Gymnasium's ``check_env`` takes the
    environment itself); see the module docstring."""
    where = env if isinstance(env, str | Path) else _env_folder(env)
    began = time.perf_counter()
    report = EnvReport(env=Path(where).name)
    try:
        environment = load_environment(where)
        checker = _Checker(environment, report, timeout_s)  # imports app.py, reads reward_range
    except ConfigError as exc:
        report.results.append(CheckResult("config", FAIL, "; ".join(exc.problems)))
    except Exception as exc:  # anything else while loading is still the environment's problem
        report.results.append(CheckResult("config", FAIL, f"{type(exc).__name__}: {exc}"))
    else:
        report.env, report.directory, report.config = (
            environment.name,
            str(environment.directory),
            str(environment.config_path),
        )
        await checker.run(max_rows)
    report.seconds = time.perf_counter() - began
    return report


def check_env(
    env: str | Path | type[ResourcesServer],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> EnvReport:
    """Synchronous ``check_env_async`` (runs its own event loop)."""
    return asyncio.run(check_env_async(env, timeout_s=timeout_s, max_rows=max_rows))
