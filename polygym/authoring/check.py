"""Conformance checks for one environment (``gym env check``), as a Python API.

In the spirit of Gymnasium's ``check_env``: start the environment alone and probe every part of the
contract a rollout relies on, so an author learns about a broken tool or verifier before a training
run does. ``check_env(name)`` (or a folder, or the server class itself) returns an ``EnvReport`` of
``CheckResult``s (pass / fail / warn / skip); only a *fail* makes ``report.ok`` false.

This module is the runner: it lists the checks in order, under the names reports and tests use,
starts and stops the server around them, and times each one. Every check is a small function of a
shared ``CheckContext`` in ``polygym.authoring.checks``, so adding one is a function there and a
line here.

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
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

from polygym.authoring import checks
from polygym.authoring.check_context import CheckContext, wrong_outputs
from polygym.authoring.probe import Probe
from polygym.authoring.report import FAIL, PASS, SKIP, WARN, CheckResult, EnvReport, Outcome
from polygym.kinds import MODEL_KIND
from polygym.net.client import ServerClient
from polygym.net.thread_server import StartupError, ThreadServer
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
_GRACEFUL_S = 0.5

Check = Callable[[CheckContext], Outcome | Awaitable[Outcome]]
"""One check (``polygym.authoring.checks``): a function of the context, sync or async."""


# ------------------------------------------------------------------------------------ the checks


def _unserved_checks() -> Iterator[tuple[str, Check]]:
    """The checks that need no server: the environment loads and has rows to check with."""
    yield "config", checks.config
    yield "dataset", checks.dataset


def _served_checks(ctx: CheckContext) -> Iterator[tuple[str, Check]]:
    """The checks of the served environment, in the order a rollout uses it.

    A generator, read as the checks run: the tool checks follow the tool listing the ``tools``
    check found, and without dataset rows one SKIP stands for every check that needs a session.
    """
    yield "liveness", checks.liveness
    yield "tools", checks.tool_listing
    for tool in ctx.tools:
        yield f"tool {tool}: schema", partial(checks.tool_schema, tool=tool)
    if not ctx.rows:
        yield "rollouts", checks.no_rows
        return
    yield "dataset tools", checks.dataset_tools
    yield "seed_session", checks.seed_sessions
    for tool in ctx.tools:
        yield f"tool {tool}: call", partial(checks.tool_call, tool=tool)
        yield f"tool {tool}: bad input", partial(checks.tool_bad_input, tool=tool)
    if issubclass(ctx.environment.server_class, EpisodicServer):
        yield "episode: reset/step", checks.episode_protocol
    yield "verify: wrong rollouts", checks.wrong_rollouts
    yield "verify: correct rollout", checks.correct_rollouts
    yield "verify: correct beats wrong", checks.correct_beats_wrong
    yield "verify: deterministic", checks.deterministic
    yield "verify: bad input", checks.verify_bad_input
    yield "aggregate_metrics", checks.aggregate_metrics
    yield "sessions released", checks.sessions_released


# ------------------------------------------------------------------------------------ the runner


async def _run_check(ctx: CheckContext, report: EnvReport, name: str, check: Check) -> None:
    """Run one check and record its outcome with its duration."""
    began = time.perf_counter()
    try:
        result = check(ctx)
        status, detail = await result if inspect.isawaitable(result) else result
    except Exception as exc:  # a checker bug must not hide the other results
        status, detail = FAIL, f"the check itself failed: {type(exc).__name__}: {exc}"
    report.results.append(CheckResult(name, status, detail, time.perf_counter() - began))


async def _run_checks(ctx: CheckContext, report: EnvReport) -> None:
    """Every check in order: those that need no server, then (if it starts) the served ones, then shutdown."""
    for name, check in _unserved_checks():
        await _run_check(ctx, report, name, check)
    runner = await _start(ctx, report)
    if runner is None:
        return
    ctx.http = Probe(runner.url, ctx.timeout_s)
    try:
        for name, check in _served_checks(ctx):
            await _run_check(ctx, report, name, check)
    finally:
        await ctx.http.close()
        await _run_check(ctx, report, "shutdown", partial(_shutdown, runner=runner))


def _failure(exc: BaseException, timeout_s: float, what: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"{what} did not finish within {timeout_s:g}s"
    if isinstance(exc, StartupError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


async def _start(ctx: CheckContext, report: EnvReport) -> ThreadServer | None:
    """Build and serve the environment alone (the "start" check): its runner, or None when it failed.

    The model servers the environment calls are played in process first ("model servers").
    """
    began = time.perf_counter()
    runner: ThreadServer | None = None
    try:
        server = ctx.environment.build()
        models = serve_model_stand_ins(ctx.environment, server.client)
        if models is not None:
            report.results.append(CheckResult("model servers", *models))
        runner = ThreadServer(server.app, server.client, _GRACEFUL_S)
        await runner.start(ctx.timeout_s)
    except Exception as exc:
        detail = _failure(exc, ctx.timeout_s, "startup")
        report.results.append(CheckResult("start", FAIL, detail, time.perf_counter() - began))
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.stop(ctx.timeout_s + _GRACEFUL_S + 1.0)
        return None
    report.results.append(CheckResult("start", PASS, f"serving on {runner.url}", time.perf_counter() - began))
    return runner


async def _shutdown(ctx: CheckContext, runner: ThreadServer) -> Outcome:
    """The server stops within its timeout (in-flight requests get a grace period, then are cancelled)."""
    limit = ctx.timeout_s + _GRACEFUL_S + 1.0
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
        ctx = CheckContext(environment, timeout_s, max_rows)  # imports app.py, reads reward_range
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
        await _run_checks(ctx, report)
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
