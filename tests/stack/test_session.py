"""``StackSession``: start or join a stack, own the client's lifetime, check the agents first."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.stack.catalog import selector_paths
from polygym.stack.config import StackConfig, load_config
from polygym.stack.launcher import Stack
from polygym.stack.session import StackSession, StackTarget, UnknownAgentError

ENV = "example_single_tool_call"
AGENT = f"{ENV}_simple_agent"


def config() -> StackConfig:
    return load_config(selector_paths([ENV], ["scripted_model"], []), env_files=[])


@pytest.mark.e2e
async def test_subprocess_stack_client_is_closed_and_stack_stopped() -> None:
    """With ``--backend subprocess`` the session creates its own HTTP client; it must not leak."""
    async with StackSession(StackTarget(config(), backend="subprocess", record=False)) as session:
        client = await session.connect()
        assert session.stack is not None and session.stack.client is None  # not the stack's own client
        names = {s["name"] for s in await client.servers()}
        assert AGENT in names
        http = client._pool
        assert http is not None and not http.closed
        stack = session.stack
    assert http.closed and client._pool is None
    assert all(proc.returncode is not None for proc in stack.backend.procs.values())  # type: ignore[union-attr]


async def test_unknown_agent_is_refused_before_anything_starts() -> None:
    async with StackSession(StackTarget(config(), record=False)) as session:
        assert session.agents == [AGENT]
        with pytest.raises(UnknownAgentError) as caught:
            session.require_agents({"environment x": "example_single_tool_cal_simple_agent"})
        assert session.stack is None
    message = str(caught.value)
    assert message.startswith("environment x: unknown agent 'example_single_tool_cal_simple_agent'.")
    assert f"Did you mean '{AGENT}'?" in message


async def test_joining_closes_only_its_client_and_leaves_the_stack_running() -> None:
    running = Stack(config(), head_port=0, record=False)
    await running.start()
    try:
        async with StackSession(StackTarget(head_url=running.head_url)) as session:
            assert session.agents == [AGENT]
            client = await session.connect()
            http = client._pool
        assert http is not None and http.closed and session.stack is None
        assert running.client is not None
        assert AGENT in {s["name"] for s in await running.client.servers()}
    finally:
        await running.stop()


def test_target_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StackTarget()
    with pytest.raises(ValueError, match="exactly one"):
        StackTarget(config(), "http://127.0.0.1:1")


async def test_a_signal_cancels_the_work_after_its_cleanup_ran() -> None:
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    with pytest.raises(Interrupted):
        await until_interrupted(work())
    assert cleaned.is_set()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is removed
