"""polygym's end of a NeMo Gym environment's fork server (``stack/nemo_gym_forkserver.py``).

One fork server runs per environment a stack's NeMo Gym servers use: it resolves the stack's
config with that environment's nemo-gym and starts each of its servers, forked from an interpreter
that imported nemo_gym's dependencies once (or as a fresh interpreter where forking would not be
the same, or when the stack says ``nemo_gym_fork: false``). The servers stay what they were to the
rest of the stack: a pid that leads its own process group, a return code (negative for a signal)
and an awaitable end, as ``asyncio.subprocess.Process`` gives; the fork server reports each exit,
since it is their parent. If the fork server itself dies, the servers it leaves are killed and
reported killed, so the stack stops loudly rather than losing track of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from polygym.stack.backend import STOP_TIMEOUT_S, LaunchError, log_tail
from polygym.stack.env_build import venv_python

FORKSERVER = Path(__file__).with_name("nemo_gym_forkserver.py")
DEPENDENCIES_FILE = "polygym-preload.json"
"""Where an environment keeps the names of the modules its fork server preloads, learnt once."""
READY_TIMEOUT_S = 300.0
"""The fork server imports nemo_gym's dependencies before it answers; cold caches make it slow."""
REPLY_LIMIT = 16 * 1024 * 1024
"""Longest line the fork server may send (a resolved config is the longest, hundreds of KiB)."""
RESOLVE_TIMEOUT_S = 300.0
"""NeMo Gym's parser completing a config: seconds; a hang stops the stack's start, named."""
STOP_GRACE_S = 10.0
"""Kept equal to the fork server's own ``STOP_GRACE_S``."""


class ForkedServer:
    """A NeMo Gym server the fork server started; its exit is reported by the fork server."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = asyncio.Event()

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The fork server of one environment: ask it to resolve a config, to start a server."""

    def __init__(self, process: asyncio.subprocess.Process, env: Path, log: Path, lease_fd: int) -> None:
        self.process = process
        self.env = env
        self.log = log
        self.lease_fd = lease_fd
        self.servers: dict[int, ForkedServer] = {}
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._asking = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(
        cls, env: Path, log: Path, child_env: dict[str, str], fork: bool, lease_fd: int
    ) -> ForkServer:
        """Start the fork server in ``env`` and wait until it has imported what it preloads.
        ``lease_fd`` (the environment's lease, ``stack.env_cache``) is inherited by it and by every
        server it starts, so the environment counts as in use while any of them lives."""
        args = [
            str(FORKSERVER),
            *(["--dependencies", str(env / DEPENDENCIES_FILE)] if fork else ["--no-fork"]),
        ]
        with log.open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                str(venv_python(env)),
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
                env=child_env,
                limit=REPLY_LIMIT,
                start_new_session=True,
                pass_fds=(lease_fd,),
            )
        server = cls(process, env, log, lease_fd)
        try:
            await asyncio.wait_for(server._next("ready"), READY_TIMEOUT_S)
        except BaseException:
            await server.close()
            raise
        return server

    async def resolve(self, config: dict[str, Any]) -> str:
        """``config`` completed by this environment's nemo-gym (``NEMO_GYM_CONFIG_DICT``); NeMo
        Gym's refusal as what it printed, for ``nemo_gym_server.refusal_text``."""
        try:
            reply = await asyncio.wait_for(self._ask({"op": "resolve", "config": config}), RESOLVE_TIMEOUT_S)
        except TimeoutError:
            raise LaunchError(
                f"NeMo Gym (in {self.env}) did not resolve the stack's config in {RESOLVE_TIMEOUT_S:g}s"
            ) from None
        if reply["op"] == "refused":
            raise ConfigRefused(reply["stderr"])
        return str(reply["yaml"])

    async def spawn(
        self, name: str, entrypoint: str, cwd: str, env: dict[str, str], log: Path
    ) -> ForkedServer:
        """Start ``python <entrypoint>`` in ``cwd`` with ``env``, its output appended to ``log``."""
        request = {"op": "spawn", "name": name, "entrypoint": entrypoint, "cwd": cwd, "env": env}
        reply = await self._ask({**request, "log": str(log), "keep_fd": self.lease_fd})
        if reply["op"] == "failed":
            raise LaunchError(f"NeMo Gym server '{name}' could not be started: {reply['error']}")
        return self.servers[int(reply["pid"])]

    async def close(self) -> None:
        """Close its stdin (it then ends any server still running) and wait for it to exit."""
        with contextlib.suppress(OSError, RuntimeError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 2 * STOP_GRACE_S + STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        await self._reader

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self._asking:
            stdin = self.process.stdin
            assert stdin is not None
            try:
                stdin.write(json.dumps(request).encode() + b"\n")
                await stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise self._died() from None
            return await self._next(*ANSWERS[request["op"]])

    async def _next(self, *ops: str) -> dict[str, Any]:
        reply = await self._replies.get()
        if reply["op"] == "gone":
            raise self._died()
        if reply["op"] not in ops:
            raise LaunchError(f"the NeMo Gym fork server in {self.env} answered {reply['op']!r}, not {ops}")
        return reply

    def _died(self) -> LaunchError:
        return LaunchError(f"the NeMo Gym fork server in {self.env} died.\n{log_tail(self.log)}")

    async def _read(self) -> None:
        """Replies to the queue, exits to their server; at its end, however it ends, what it leaves
        is killed and every waiter is told."""
        stdout = self.process.stdout
        assert stdout is not None
        try:
            while line := await stdout.readline():
                self._route(json.loads(line))
        except (ValueError, asyncio.IncompleteReadError) as exc:  # not our protocol: loud, then as dead
            print(f"error: the NeMo Gym fork server in {self.env} sent {exc!r}", file=sys.stderr)
        finally:
            self._orphaned()

    def _route(self, message: dict[str, Any]) -> None:
        if message["op"] == "exited":
            self.servers[int(message["pid"])].ended(int(message["returncode"]))
            return
        if message["op"] == "spawned":
            self.servers[int(message["pid"])] = ForkedServer(int(message["pid"]))
        self._replies.put_nowait(message)

    def _orphaned(self) -> None:
        """The fork server is gone: the servers it did not report are killed and reported killed."""
        for server in self.servers.values():
            if server.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.ended(-signal.SIGKILL)
        self._replies.put_nowait({"op": "gone"})


ANSWERS = {"resolve": ("resolved", "refused"), "spawn": ("spawned", "failed")}
"""The replies each request may get."""


class ConfigRefused(Exception):
    """NeMo Gym refused the stack's config; the argument is what it printed."""
