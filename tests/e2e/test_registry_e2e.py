"""End to end: a stack's registry admits only its own servers, status shows what it holds, the
stack secret stays inside the stack, and the servers' pools follow the stack's concurrency.

Real servers on 127.0.0.1, the scripted model; every process started here is stopped here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.net.retry import NO_RETRY
from polygym.stack import records as stacks
from polygym.stack.head import BY_SECRET, STACK_SECRET_HEADER
from polygym.stack.launcher import Stack
from polygym.stack.session import StackSession, StackTarget
from tests.conftest import gym_command
from tests.e2e.test_stack_e2e import ENVS, SELECTORS, example_rows, two_env_config

pytestmark = pytest.mark.e2e

AGENT = f"{ENVS[0]}_simple_agent"


def impostor_app() -> tuple[Starlette, list[str]]:
    """A model server that is not the stack's: it records every call it gets."""
    hits: list[str] = []

    async def anything(request: Request) -> JSONResponse:
        hits.append(request.url.path)
        return JSONResponse({"error": {"type": "impostor", "message": "answered by an impostor"}}, 500)

    return Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])]), hits


async def test_an_impostor_cannot_take_over_the_policy_model_of_a_standalone_stack() -> None:
    """A stack no collector started: its servers' pools have no limit, and its registry holds."""
    stack = Stack(two_env_config(), backend="subprocess", head_port=0, record=False)
    await stack.start()
    app, hits = impostor_app()
    impostor = AppServer(app, bind_socket("127.0.0.1", 0))
    await impostor.start()
    client = ServerClient(stack.head_url, pool_size=8)
    try:
        assert {s["pool_size"] for s in stack.servers()} == {None}  # no collector's cap to follow
        real = next(s for s in stack.servers() if s["name"] == "policy_model")
        claim = {**real, "url": impostor.url, "pid": psutil.Process().pid}
        register = f"{stack.head_url}/register"
        for headers, status in (
            ({}, 401),
            ({STACK_SECRET_HEADER: "guessed"}, 403),
            ({STACK_SECRET_HEADER: stack.secret}, 409),  # even the secret does not replace a name
        ):
            reply = await client.request_url("POST", register, claim, headers=headers, retry=NO_RETRY)
            assert reply.status == status, reply.body
        listed = {s["name"]: s for s in await client.servers()}
        assert listed["policy_model"]["url"] == real["url"]
        assert listed["policy_model"]["pid"] == real["pid"] == stack.backend.pids()["policy_model"]
        for row in example_rows(ENVS[0])[:3]:
            result = (await client.call(AGENT, "/run", row)).json()
            assert result["reward"] == 1.0, result
        assert hits == []
    finally:
        await client.close()
        await impostor.stop()
        await stack.stop()


def gym_status(*args: str) -> str:
    done = subprocess.run(gym_command("env", "status", *args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_lists_what_the_registry_holds(start_stack: Any) -> None:
    stack = start_stack(*SELECTORS, "--backend", "subprocess", "--concurrency", "2000")
    [record] = orjson.loads(gym_status("--json"))
    registry = {e["name"]: e for e in record["registry"]}
    assert registry.keys() == {s["name"] for s in stack.record["servers"]} and len(registry) == 5
    for name, entry in registry.items():
        assert (entry["url"], entry["pid"]) == (stack.server(name)["url"], stack.server(name)["pid"])
        assert entry["registered_by"] == BY_SECRET
        assert entry["pool_size"] == 2000  # the child's own client: no cap below --concurrency
    assert record["unexpected"] == []
    text = gym_status()
    for entry in registry.values():
        line = next(line for line in text.splitlines() if entry["url"] in line)
        assert entry["name"] in line and str(entry["pid"]) in line and BY_SECRET in line and "2000" in line


async def test_pools_follow_the_collectors_concurrency() -> None:
    """The hidden cap: every pool was 1024 whatever --concurrency said."""
    inline = StackSession(StackTarget(two_env_config(), record=False), pool_size=2000)
    async with inline:
        client = await inline.connect()
        assert client.pool_size == 2000
        assert client._http_pool().limit == 2000
        assert {s["pool_size"] for s in await client.servers()} == {2000}
    spawned = StackSession(StackTarget(two_env_config(), backend="subprocess", record=False), pool_size=2000)
    async with spawned:
        client = await spawned.connect()
        assert client.pool_size == 2000
        assert {s["pool_size"] for s in await client.servers()} == {2000}


async def test_the_stack_secret_stays_inside_the_stack(state_dir: Path) -> None:
    stack = Stack(two_env_config(), backend="subprocess", head_port=0, record=True)
    await stack.start()
    client = ServerClient(stack.head_url, pool_size=8)
    try:
        secret = stack.secret
        assert len(secret) >= 32
        assert {s["registered_by"] for s in stack.servers()} == {BY_SECRET}  # the children had it
        for pid in stack.backend.pids().values():
            child = psutil.Process(pid)
            assert secret not in " ".join(child.cmdline())
            assert secret not in " ".join(f"{k}={v}" for k, v in child.environ().items())
        for route in ("/", "/servers", "/config"):
            assert secret not in (await client.request_url("GET", stack.head_url + route)).body.decode()
        row = example_rows(ENVS[0])[0]
        assert (await client.call(AGENT, "/run", row)).json()["reward"] == 1.0
        shown = gym_status() + gym_status("--json")
        assert stack.stack_id in shown and secret not in shown
        written = [p for p in state_dir.rglob("*") if p.is_file()]
        assert any(p.suffix == ".log" for p in written) and any(p.suffix == ".json" for p in written)
        for path in written:
            assert secret not in path.read_text(errors="replace"), path
        [record_file] = stacks.stacks_dir().glob("*.json")
        assert record_file.stat().st_mode & 0o777 == 0o600
    finally:
        await client.close()
        await stack.stop()
