"""Running untrusted Python off the event loop, in a separate, limited, killable process.

``Sandbox.run`` starts ``sandbox_runner.py`` with ``asyncio.create_subprocess_exec`` (the event
loop never blocks), sends it the code and the test *inputs* on stdin, reads at most
``max_output_bytes`` of its JSON-lines report and kills its whole process group when it is done,
past ``wall_s``, or when it floods the pipe. The expected outputs stay in this process; the caller
compares them with the returned values (see ``sandbox_runner`` for why that matters).

Layers, outermost first (all measured on a root Linux VM; see the README's table):

- wall-clock timeout and process-group SIGKILL from here (``start_new_session=True``);
- ``namespaces`` isolation, used when running as root: fresh mount/PID/network/IPC/UTS namespaces,
  a tmpfs root (``tmpfs_mb``) that holds only ``/usr`` and the interpreter read-only, a dedicated
  uid per concurrent slot (``uid_base + slot``; never a real account) so RLIMIT_NPROC counts only
  that run's processes and the submission cannot signal the server, ``no_new_privs``, and the PID
  namespace's teardown that kills every leftover process;
- rlimits in the child: CPU seconds, address space, file size, open files, no core dumps (and
  RLIMIT_NPROC in ``namespaces`` mode, where it is per-slot);
- a minimal environment (no API keys or tokens inherited from the server's environment).

``basic`` isolation (not root, or namespaces unavailable) keeps the rlimits, the fresh temporary
working directory, the environment scrub and the process-group kill, but the child runs as the
server's user and sees its files and network: use it for development, not for hostile policies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

logger = logging.getLogger("polygym.code_exec")

RUNNER = Path(__file__).with_name("sandbox_runner.py")
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
STDERR_CAP = 16_384


class SandboxLimits(BaseModel):
    """Per-run limits; each is enforced by the kernel or by this process, not by the submission."""

    wall_s: float = Field(10.0, gt=0, description="whole run, from spawn to exit")
    cpu_s: float = Field(5.0, gt=0, description="RLIMIT_CPU of the worker (SIGXCPU, then SIGKILL)")
    memory_mb: int = Field(512, ge=64, description="RLIMIT_AS of the worker")
    file_mb: int = Field(4, ge=1, description="RLIMIT_FSIZE: the largest file it may write")
    tmpfs_mb: int = Field(16, ge=1, description="namespaces mode: size of the whole writable root")
    nproc: int = Field(32, ge=1, description="namespaces mode: RLIMIT_NPROC of the slot's uid")
    nofile: int = Field(64, ge=16, description="RLIMIT_NOFILE")
    per_test_timeout_s: float = Field(2.0, gt=0, description="timer per call (and for loading the code)")
    max_output_bytes: int = Field(1_000_000, ge=4096, description="report bytes read before killing")
    max_value_chars: int = Field(100_000, ge=16, description="largest JSON return value accepted")
    max_print_chars: int = Field(10_000, ge=0, description="the submission's prints kept (then dropped)")

    def runner_limits(self) -> dict[str, Any]:
        mib = 1024 * 1024
        return {
            "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_mb * mib,
            "file_bytes": self.file_mb * mib,
            "tmpfs_bytes": self.tmpfs_mb * mib,
            "nproc": self.nproc,
            "nofile": self.nofile,
            "per_test_timeout_s": self.per_test_timeout_s,
            "max_value_chars": self.max_value_chars,
            "max_print_chars": self.max_print_chars,
        }


class SandboxConfig(BaseModel):
    isolation: Literal["auto", "namespaces", "basic"] = "auto"
    uid_base: int = Field(3_100_000, ge=1000, description="slot k runs as uid/gid uid_base + k")
    max_concurrent: int = Field(4, ge=1, description="runs at once; more wait their turn")
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


@dataclass
class CaseOutcome:
    """What one call returned: ``value`` (JSON data) or ``error`` (a one-line description)."""

    index: int
    value: Any = None
    error: str | None = None


@dataclass
class RunResult:
    isolation: str
    outcomes: dict[int, CaseOutcome] = field(default_factory=dict)
    load_error: str | None = None
    setup_error: str | None = None
    timed_out: bool = False
    output_overflow: bool = False
    finished: bool = False
    exit_code: int | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""

    @property
    def status(self) -> str:
        """One word for the run: ok, load_error, timeout, output_limit, crashed, setup_error."""
        if self.setup_error:
            return "setup_error"
        if self.load_error:
            return "load_error"
        if self.output_overflow:
            return "output_limit"
        if self.timed_out:
            return "timeout"
        return "ok" if self.finished else "crashed"


class SandboxSetupError(RuntimeError):
    """The sandbox itself could not be built (not the submission's fault)."""


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _read_into(stream: asyncio.StreamReader, buf: bytearray, cap: int) -> bool:
    """Append to ``buf`` until EOF or ``cap`` bytes; True when the stream had more.

    Filling a caller-owned buffer keeps what arrived before a timeout cancels the read.
    """
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return False
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            return True
        buf += chunk


def parse_report(data: bytes, result: RunResult) -> None:
    """Fill ``result`` from the runner's JSON lines; garbage lines are skipped, first answer wins."""
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        event = record.get("event")
        index = record.get("i")
        if event == "setup_error":
            result.setup_error = str(record.get("error", ""))[:2000]
        elif event == "ready":
            result.isolation = str(record.get("isolation", result.isolation))
        elif event == "load_error" and result.load_error is None:
            result.load_error = str(record.get("error", ""))[:2000]
        elif event == "done":
            result.finished = True
        elif type(index) is int and index not in result.outcomes:
            if "value" in record and "error" not in record:
                result.outcomes[index] = CaseOutcome(index, value=record["value"])
            else:
                result.outcomes[index] = CaseOutcome(
                    index, error=str(record.get("error", "no result"))[:2000]
                )


class Sandbox:
    """Runs submissions with at most ``max_concurrent`` at once, each in its own uid slot."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        wanted = self.config.isolation
        self.isolation = wanted if wanted != "auto" else ("namespaces" if self._can_namespace() else "basic")
        self._slots: asyncio.Queue[int] | None = None

    @staticmethod
    def _can_namespace() -> bool:
        return sys.platform.startswith("linux") and os.geteuid() == 0

    def _slot_queue(self) -> asyncio.Queue[int]:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for slot in range(self.config.max_concurrent):
                self._slots.put_nowait(slot)
        return self._slots

    async def run(self, code: str, entry_point: str, inputs: list[dict[str, Any]]) -> RunResult:
        """Run ``code`` and call ``entry_point(*args, **kwargs)`` for each input; never raises for
        anything the code does. Raises SandboxSetupError when explicit ``namespaces`` isolation
        cannot be set up."""
        slots = self._slot_queue()
        slot = await slots.get()
        try:
            result = await self._run_once(code, entry_point, inputs, slot, self.isolation)
            if result.setup_error and self.isolation == "namespaces":
                if self.config.isolation == "namespaces":
                    raise SandboxSetupError(f"namespaces isolation failed: {result.setup_error}")
                logger.warning(
                    "code_exec: namespaces isolation unavailable (%s); falling back to basic isolation",
                    result.setup_error,
                )
                self.isolation = "basic"
                result = await self._run_once(code, entry_point, inputs, slot, "basic")
            return result
        finally:
            slots.put_nowait(slot)

    async def _run_once(
        self, code: str, entry_point: str, inputs: list[dict[str, Any]], slot: int, isolation: str
    ) -> RunResult:
        limits = self.config.limits
        workdir = tempfile.mkdtemp(prefix="polygym-code-") if isolation == "basic" else None
        payload = {
            "isolation": isolation,
            "uid": self.config.uid_base + slot,
            "workdir": workdir,
            "code": code,
            "entry_point": entry_point,
            "inputs": inputs,
            "limits": limits.runner_limits(),
        }
        result = RunResult(isolation=isolation)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(RUNNER),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=CHILD_ENV,
            cwd=workdir or "/",
        )
        out, err = bytearray(), bytearray()
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            async with asyncio.timeout(limits.wall_s):
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(json.dumps(payload).encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                err_task = asyncio.ensure_future(_read_into(proc.stderr, err, STDERR_CAP))
                try:
                    result.output_overflow = await _read_into(proc.stdout, out, limits.max_output_bytes)
                    if result.output_overflow:
                        _kill_group(proc.pid)
                    await err_task
                finally:
                    err_task.cancel()
                result.exit_code = await proc.wait()
        except TimeoutError:
            result.timed_out = True
        finally:
            _kill_group(proc.pid)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        result.exit_code = await proc.wait()
            # Pipes a killed run left unread would otherwise close at garbage collection, possibly
            # after the loop is gone; the transport is only reachable through a private attribute.
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
            if workdir:
                await asyncio.to_thread(shutil.rmtree, workdir, True)
        result.duration_s = time.monotonic() - started
        parse_report(bytes(out), result)
        result.stderr_tail = bytes(err[-2000:]).decode("utf-8", "replace")
        return result
