"""Shared fixtures: an isolated state directory per test and real `gym env start` processes.

Readiness is detected by polling the stack record the launcher writes once every server has
registered — never by sleeping for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym.jsonl import iter_jsonl
from polygym.net.listen import AppServer, bind_socket
from polygym.stack import records as stacks
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
TWO_ENV_SPEC = """
environments:
  - name: example_single_tool_call
    weight: 3
  - name: example_multi_step
    weight: 1
prompts_per_step: 4
responses_per_prompt: 2
seed: 13
"""
"""A small blend of both example environments (3:1, two responses per prompt) for CLI tests."""


def pytest_configure(config: pytest.Config) -> None:
    """Let this run and every process it starts keep compiled bytecode (``__pycache__``, ignored
    by git), even where the environment sets ``PYTHONDONTWRITEBYTECODE``: otherwise each `gym`
    command, stack server and Ray actor compiles polygym from source again (~0.4 s of CPU each,
    hundreds of times a run), and each xdist worker rewrites every test module's asserts again.
    Runs in the controller before xdist starts its workers, which inherit the environment."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


WAITING_SHARE_WORKERS = 1
"""Workers beyond one per usable core. Most of a stack test's time is spent waiting (on servers
starting, model latencies, Ray, the children it runs): on 2 cores (2026-12-06) the tests' own CPU
time, theirs and their children's, was about a third of their wall time, and the whole suite took
883 s with 3 workers against 1,013 s with 2 on the same loaded machine. One more worker than cores
fills that waiting with another test's work."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the suite's default): one worker per usable core, plus the waiting share."""
    return len(os.sched_getaffinity(0)) + WAITING_SHARE_WORKERS


HEAVIEST_FIRST = ("slow", "nemo_gym", "ray", "e2e")
"""The tiers' marks, costliest first: a slow or NeMo Gym test takes tens of seconds, a Ray or e2e
test seconds, an unmarked one milliseconds."""


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests sharing a module's fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the costliest tier first. xdist's worksteal hands each worker a contiguous share of this
    order and a worker that runs dry takes the tail of another's queue, so the long tests start
    early on one worker and the quick ones fill both at the end: the workers finish together
    instead of one starting a minute-long test while the other is idle. The sort is stable, so a
    module's tests (and the module-scoped fixture they share) stay together within a tier."""

    def tier(item: pytest.Item) -> int:
        marks = {mark.name for mark in item.iter_markers()}
        return next((i for i, name in enumerate(HEAVIEST_FIRST) if name in marks), len(HEAVIEST_FIRST))

    items.sort(key=tier)


@pytest.fixture
def fake_nemo_gym_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A NeMo Gym root holding one resources server, ``ng_env`` (its app.py imports nemo_gym, which
    polygym's process cannot import); returns the ``agent_ref`` of its agent."""
    folder = tmp_path / "nemo_gym_root" / "resources_servers" / "ng_env"
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text("from nemo_gym.base_resources_server import SimpleResourcesServer\n")
    (folder / "configs" / "ng_env.yaml").write_text(
        "ng_env:\n  resources_servers:\n    ng_env:\n      entrypoint: app.py\n      domain: math\n"
        "ng_env_simple_agent:\n  responses_api_agents:\n    simple_agent:\n"
        "      resources_server: {type: resources_servers, name: ng_env}\n"
        "      model_server: {type: responses_api_models, name: policy_model}\n"
    )
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(folder.parent.parent))
    return {"type": "responses_api_agents", "name": "ng_env_simple_agent"}


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own stack registry so parallel or leftover stacks never interfere."""
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("POLYGYM_STATE_DIR", str(path))
    return path


def gym_command(*args: str) -> list[str]:
    """``gym ARGS`` as a child process; a ``gym env start`` binds its head on any free port unless the
    test names one, so tests running in parallel never race for the default port 11000."""
    if args[:2] == ("env", "start") and "--head-port" not in args:
        args = (*args, "--head-port", "0")
    return [sys.executable, "-m", "polygym", *args]


def run_gym(*args: str, cwd: Path = ROOT, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``gym ARGS`` as a user types it, in ``cwd``; its exit status and output for the test to check."""
    return subprocess.run(gym_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


class StackProcess:
    """A `gym env start` child process and the stack record it published."""

    def __init__(self, args: list[str], cwd: Path = ROOT) -> None:
        self.log = (Path(os.environ["POLYGYM_STATE_DIR"]) / f"launcher-{time.monotonic_ns()}.log").open("w+b")
        self.proc = subprocess.Popen(
            gym_command("env", "start", *args), cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.record = self._wait_ready()

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for record in stacks.list_stacks():
                if record["pid"] == self.proc.pid:
                    return record
            if self.proc.poll() is not None:
                raise AssertionError(f"gym env start exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"stack not ready within {READY_TIMEOUT_S}s:\n{self.output()}")

    def server(self, name: str) -> dict[str, Any]:
        return next(s for s in self.record["servers"] if s["name"] == name)

    def child_pids(self) -> list[int]:
        """The processes the stack started (an external server has no pid of ours)."""
        return sorted({s["pid"] for s in self.record["servers"] if s.get("pid")} - {self.proc.pid})

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        """Stop the launcher we started (by its PID), then any of its children still alive."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.child_pids():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        self.log.close()


@pytest.fixture
def start_stack() -> Iterator[Any]:
    started: list[StackProcess] = []

    def start(*args: str, cwd: Path = ROOT) -> StackProcess:
        stack = StackProcess(list(args), cwd)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        stack.stop()


class ChatEndpoint:
    """A Chat Completions endpoint on a thread of its own (``with``: started, then stopped), for
    tests that need a policy URL outside the stack; a subclass answers in ``chat``."""

    def __init__(self) -> None:
        self.sock = bind_socket("127.0.0.1", 0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.server = AppServer(app, self.sock)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    async def chat(self, request: Request) -> Response:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def listening_hosts(pid: int) -> set[str]:
    """The addresses that process ``pid`` and every process under it listen on (TCP)."""
    hosts: set[str] = set()
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            hosts |= {c.laddr.ip for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return hosts


def row_keys(path: Path) -> list[tuple[int, int]]:
    """The (task, rollout) keys of a rollouts file, in file order."""
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in iter_jsonl(path)]


def interrupt_gym(
    args: list[str], cwd: Path, output: Path, rows: int, sig: signal.Signals
) -> tuple[int, str]:
    """Start ``gym ARGS``, send it ``sig`` once ``output`` holds ``rows`` rows; (exit status, stderr)."""
    proc = subprocess.Popen(
        gym_command(*args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_until(lambda: output.exists() and len(row_keys(output)) >= rows, 60)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr


JUDGE_CONFIG = """
judge_model:
  responses_api_models:
    scripted_model:
      entrypoint: app.py
      script: [{{answer: "{answer}"}}]
reference_judge:
  resources_servers:
    reference_judge:
      judge_model_server: {{type: responses_api_models, name: judge_model}}
"""
"""``reference_judge`` whose judge model always answers ``{answer}`` (format it)."""
JUDGE_DATA = ROOT / "resources_servers/reference_judge/data/example.jsonl"
JUDGE_SERVE = [
    "--model-type",
    "scripted_model",
    "--resources-server",
    "reference_judge",
    "--config",
    "judge.yaml",
]
"""The selectors of a judged stack, with ``judge.yaml`` (``JUDGE_CONFIG``) in the working directory."""


def wait_until(predicate: Any, timeout_s: float = 15.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
"""A Responses function tool, the one ``WEATHER_RULE`` calls."""
WEATHER_RULE = {
    "name": "weather",
    "when_tools": ["get_weather"],
    "match": r"weather in (?P<city>[A-Z][^?.,!\n]*)[?.,!]",
    "calls": [{"tool": "get_weather", "arguments": {"city": "{city}"}}],
    "answer": "It is {last_output} in {city}.",
}
"""A scripted model's rule: "weather in X?" with the tool offered -> call get_weather(X), then answer."""


async def sdk_weather_round_trip(sdk: Any) -> Any:
    """A tool call, its output and the answer through both of the OpenAI SDK's dialects (Responses,
    then Chat Completions), against a model server whose policy follows ``WEATHER_RULE``. Returns the
    first Responses reply for the caller's own checks."""
    input_: list[dict[str, Any]] = [{"role": "user", "content": "What's the weather in Buenos Aires?"}]
    first = await sdk.responses.create(model="whatever", input=input_, tools=[WEATHER_TOOL])
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "get_weather",
        {"city": "Buenos Aires"},
    )
    input_ += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "warm"},
    ]
    second = await sdk.responses.create(model="whatever", input=input_, tools=[WEATHER_TOOL])
    assert second.output_text == "It is warm in Buenos Aires."

    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Oslo?"}]
    chat = await sdk.chat.completions.create(model="whatever", messages=messages, tools=[chat_tool])
    assert chat.choices[0].finish_reason == "tool_calls"
    tool_call = chat.choices[0].message.tool_calls[0]
    assert json.loads(tool_call.function.arguments) == {"city": "Oslo"}
    messages += [
        chat.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "snowing"},
    ]
    chat = await sdk.chat.completions.create(model="whatever", messages=messages, tools=[chat_tool])
    assert (chat.choices[0].finish_reason, chat.choices[0].message.content) == (
        "stop",
        "It is snowing in Oslo.",
    )
    return first


BOOM_APP = """
from polygym.protocol import VerifyRequest, VerifyResponse
from polygym.servers.resources import ResourcesServer


class BoomVerifyRequest(VerifyRequest):
    explode: bool = False


class Boom(ResourcesServer):
    async def verify(self, body: BoomVerifyRequest) -> VerifyResponse:
        if body.explode:
            raise RuntimeError("verifier exploded on purpose")
        return VerifyResponse(**body.model_dump(), reward=1.0)
"""
"""A resources server whose verifier raises when the row says ``explode``."""
