"""Running untrusted Python off the event loop, in a separate, limited, killable process.

``Sandbox.run`` starts ``sandbox_runner.py`` with ``asyncio.create_subprocess_exec`` (the event
loop never blocks), sends it the code and the test *inputs* on stdin, and listens on two pipes it
created (see ``sandbox_runner``): a control pipe that only trusted code writes, before the
submission exists, and a result pipe whose records are the submission's claims. The expected
outputs stay in this process; the caller compares them with the returned values.

What a run is judged by is what this process observes: the control line, the exit, the wall
clock, the bytes read, the cgroup's counters or the process-tree poll (``containment``). Nothing
the child prints can change the isolation, and nothing it does is an infrastructure failure: a
run that broke a rule has a ``violation`` and scores 0.

The isolation is fixed by the config and checked once, at startup (``Sandbox.start``): a probe
submission runs in the configured mode, and a mode that cannot be had raises
``SandboxSetupError`` naming the missing capability. There is no fallback: ``basic`` is an
explicit opt-in for development and logs a warning.

Layers, outermost first:

- wall-clock timeout, then SIGKILL of the whole submission (process group, process tree, cgroup);
- whole-submission memory and process limits (``containment``: cgroup, else a process-tree poll);
- parent-death signals, so nothing outlives the server, even after ``kill -9``;
- ``namespaces`` isolation: fresh mount/PID/network/IPC/UTS namespaces, a ``disk_mb`` tmpfs root
  holding only ``/usr`` and the interpreter read-only, a dedicated uid per concurrent slot
  (``uid_base + slot``; never a real account), ``no_new_privs``;
- a seccomp filter: no ``memfd_create``, ``memfd_secret``, ``shmget`` or ``msgget``, whose memory no
  process-tree poll sees (``sandbox_runner.forbid_uncounted_memory``);
- rlimits in the child: CPU seconds, address space, file size, open files, no core dumps (and
  RLIMIT_NPROC in ``namespaces`` mode, where it is per slot);
- a minimal environment (no API keys or tokens inherited from the server's environment).
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

from pydantic import BaseModel, ConfigDict, Field

from resources_servers.code_exec.containment import Contained, Containment, ContainmentError, Enforcement

logger = logging.getLogger("polygym.code_exec")

RUNNER = Path(__file__).with_name("sandbox_runner.py")
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
CONTROL_CAP = 4096
CAP_SYS_ADMIN = 21
TRUSTED_PROCESSES = 2  # the runner and, in namespaces mode, the namespace's init
NAMESPACES_NEED = (
    "namespaces isolation needs root with CAP_SYS_ADMIN (unshare CLONE_NEWNS/NEWPID/NEWNET/NEWIPC/NEWUTS); "
    "set isolation: basic to run without it (development only: the code then runs as this user)"
)
PROBE_CODE = "def probe():\n    return 'ok'\n"


class SandboxLimits(BaseModel):
    """Per-run limits; each is enforced by the kernel or by this process, not by the submission.

    Unknown keys are an error, not ignored: a misspelled or renamed limit (``tmpfs_mb`` is now
    ``disk_mb``) would otherwise leave the sandbox on a default its author did not choose.
    """

    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(10.0, gt=0, description="whole run, from spawn to exit")
    cpu_s: float = Field(5.0, gt=0, description="RLIMIT_CPU of each process (SIGXCPU, then SIGKILL)")
    memory_mb: int = Field(512, ge=64, description="the whole submission (cgroup or process tree)")
    file_mb: int = Field(4, ge=1, description="RLIMIT_FSIZE: the largest file it may write")
    disk_mb: int = Field(16, ge=1, description="namespaces mode: size of the whole writable root")
    nproc: int = Field(32, ge=1, description="processes of the whole submission")
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
            "disk_bytes": self.disk_mb * mib,
            "nproc": self.nproc,
            "nofile": self.nofile,
            "per_test_timeout_s": self.per_test_timeout_s,
            "max_value_chars": self.max_value_chars,
            "max_print_chars": self.max_print_chars,
        }


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as for the limits: no setting silently ignored
    isolation: Literal["namespaces", "basic"] = "namespaces"
    enforcement: Enforcement = Field(
        "auto", description="whole-submission limits: auto takes a cgroup where one is writable"
    )
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
    limit: str | None = None
    timed_out: bool = False
    output_overflow: bool = False
    protocol_error: str | None = None
    finished: bool = False
    exit_code: int | None = None
    duration_s: float = 0.0

    @property
    def violation(self) -> str | None:
        """The rule the run broke, which scores it 0: a limit, the wall clock, the report, the exit."""
        if self.limit:
            return self.limit
        if self.output_overflow:
            return "output_limit"
        if self.timed_out:
            return "timeout"
        if self.protocol_error:
            return "protocol_error"
        if self.load_error:
            return None
        if not self.finished or self.exit_code != 0:
            return "crashed"
        return None

    @property
    def status(self) -> str:
        """One word for the run: ok, load_error, or the violation."""
        return self.violation or ("load_error" if self.load_error else "ok")


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


def parse_report(data: bytes, expected: int, result: RunResult) -> None:
    """Fill ``result`` from the result pipe; exactly the runner's sequence, or a protocol error.

    The runner writes ``loaded`` (or one ``load_error``), then one record per input in order, then
    ``done``. Anything else on the pipe was written by the submission: the run gets
    ``protocol_error`` (scored 0), whatever it claimed.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a record cut off by a kill
    if tail.strip() and not (result.timed_out or result.limit or result.output_overflow):
        result.protocol_error = "an unterminated record on the result pipe"
    state = "start"
    for number, line in enumerate(lines, 1):
        problem = _take(line, state, expected, result)
        if problem is not None:
            result.protocol_error = f"result record {number}: {problem}"
            return
        state = "cases" if state == "start" and not result.load_error else state
        if result.finished or result.load_error:
            state = "closed"


def _take(line: bytes, state: str, expected: int, result: RunResult) -> str | None:
    """Apply one record; the reason it is not the next one the runner would write, if so."""
    try:
        record = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(record, dict) or state == "closed":
        return "unexpected record"
    event = record.get("event")
    if state == "start":
        if event == "loaded" and len(record) == 1:
            return None
        if event == "load_error" and isinstance(record.get("error"), str) and len(record) == 2:
            result.load_error = record["error"][:2000]
            return None
        return "expected the load event"
    index = len(result.outcomes)
    if index == expected:
        if event == "done" and len(record) == 1:
            result.finished = True
            return None
        return "expected the done event"
    if record.get("i") != index or type(record.get("i")) is not int:
        return f"expected the result of test {index}"
    if set(record) == {"i", "value"}:
        result.outcomes[index] = CaseOutcome(index, value=record["value"])
    elif set(record) == {"i", "error"} and isinstance(record["error"], str):
        result.outcomes[index] = CaseOutcome(index, error=record["error"][:2000])
    else:
        return "malformed test result"
    return None


def has_cap_sys_admin() -> bool:
    """CAP_SYS_ADMIN in this process's effective set (a container may be root without it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return False


class Sandbox:
    """Runs submissions with at most ``max_concurrent`` at once, each in its own uid slot."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation: str = self.config.isolation
        self._containment: Containment | None = None
        self._slots: asyncio.Queue[int] | None = None
        self._starting: asyncio.Lock | None = None

    @property
    def enforcement(self) -> str | None:
        """How whole-submission limits are enforced, once started: "cgroup v1/v2" or process_tree."""
        return self._containment.describe() if self._containment is not None else None

    async def start(self) -> None:
        """Check, once, that the configured isolation works here, by running a probe submission.

        Raises SandboxSetupError naming what is missing; never picks a weaker mode instead.
        """
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._containment is not None:
                return
            if self.isolation == "namespaces" and not (
                sys.platform.startswith("linux") and os.geteuid() == 0 and has_cap_sys_admin()
            ):
                raise SandboxSetupError(NAMESPACES_NEED)
            if self.isolation == "basic":
                logger.warning(
                    "code_exec: sandbox isolation is 'basic': submissions run as this server's user and "
                    "can read its files and reach its network; use it for trusted code only"
                )
            try:
                containment = Containment(self.config.enforcement)
            except ContainmentError as exc:
                raise SandboxSetupError(str(exc)) from None
            result = await self._run(containment, PROBE_CODE, "probe", [{}])
            if result.status != "ok" or result.outcomes[0].value != "ok":
                raise SandboxSetupError(
                    f"the sandbox's startup probe ({self.isolation}, {containment.describe()}) "
                    f"did not run: status {result.status}"
                )
            self._containment = containment

    def _slot_queue(self) -> asyncio.Queue[int]:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for slot in range(self.config.max_concurrent):
                self._slots.put_nowait(slot)
        return self._slots

    async def run(self, code: str, entry_point: str, inputs: list[dict[str, Any]]) -> RunResult:
        """Run ``code`` and call ``entry_point(*args, **kwargs)`` for each input.

        Never raises for anything the code does; raises SandboxSetupError only when the sandbox
        itself failed before the code existed (reported by trusted code on the control pipe).
        """
        await self.start()
        assert self._containment is not None
        return await self._run(self._containment, code, entry_point, inputs)

    async def _run(
        self, containment: Containment, code: str, entry_point: str, inputs: list[dict[str, Any]]
    ) -> RunResult:
        slots = self._slot_queue()
        slot = await slots.get()
        try:
            limits = self.config.limits
            contained = await asyncio.to_thread(
                containment.new_run, limits.memory_mb * 1024 * 1024, limits.nproc + TRUSTED_PROCESSES
            )
            try:
                return await self._run_once(contained, code, entry_point, inputs, slot)
            finally:
                await contained.close()
        finally:
            slots.put_nowait(slot)

    async def _run_once(
        self, contained: Contained, code: str, entry_point: str, inputs: list[dict[str, Any]], slot: int
    ) -> RunResult:
        limits = self.config.limits
        workdir = tempfile.mkdtemp(prefix="polygym-code-") if self.isolation == "basic" else None
        control_read, control_write = os.pipe()
        result_read, result_write = os.pipe()
        payload = {
            "isolation": self.isolation,
            "uid": self.config.uid_base + slot,
            "workdir": workdir,
            "code": code,
            "entry_point": entry_point,
            "inputs": inputs,
            "limits": limits.runner_limits(),
            "control_fd": control_write,
            "result_fd": result_write,
            "parent_pid": os.getpid(),
            "cgroups": contained.join_files,
        }
        result = RunResult(isolation=self.isolation)
        started = time.monotonic()
        control_line = b""
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                str(RUNNER),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(control_write, result_write),
                start_new_session=True,
                env=CHILD_ENV,
                cwd=workdir or "/",
            )
        except BaseException:
            os.close(control_read)
            os.close(result_read)
            raise
        finally:
            os.close(control_write)
            os.close(result_write)
        control, control_transport = await _pipe_reader(control_read, CONTROL_CAP)
        results, result_transport = await _pipe_reader(result_read, 65536)
        watcher: asyncio.Task[None] | None = None
        out = bytearray()
        try:
            async with asyncio.timeout(limits.wall_s):
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(json.dumps(payload).encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                control_line = await _read_line(control)
                if control_line == b"ready\n":
                    control_transport.close()  # one line, then never another byte from there
                    watcher = asyncio.ensure_future(contained.watch(proc.pid))
                    result.output_overflow = await _read_into(results, out, limits.max_output_bytes)
                    if not result.output_overflow:
                        result.exit_code = await proc.wait()
        except TimeoutError:
            result.timed_out = True
        finally:
            if watcher is not None:
                watcher.cancel()
            if proc.returncode is None:
                await contained.kill(proc.pid)
            _kill_group(proc.pid)
            await _reap(proc)
            await contained.sweep()
            control_transport.close()
            result_transport.close()
            # Pipes a killed run left unread would otherwise close at garbage collection, possibly
            # after the loop is gone; the transport is only reachable through a private attribute.
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
            if workdir:
                await asyncio.to_thread(shutil.rmtree, workdir, True)
        if control_line != b"ready\n":
            raise SandboxSetupError(_setup_failure(control_line, result, limits.wall_s))
        await asyncio.to_thread(contained.read_verdict)
        result.limit = contained.verdict
        result.duration_s = time.monotonic() - started
        parse_report(bytes(out), len(inputs), result)
        return result


def _setup_failure(line: bytes, result: RunResult, wall_s: float) -> str:
    """Why the sandbox failed before the submission existed, from the trusted control line."""
    text = line.decode("utf-8", "replace").strip()
    if text.startswith("error: "):
        return f"sandbox setup failed: {text[len('error: ') :]}"
    if result.timed_out:
        return f"sandbox setup did not finish within wall_s={wall_s:g}s"
    return f"the sandbox runner exited before it was ready (exit code {result.exit_code})"


async def _pipe_reader(fd: int, limit: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """One control line (or what came before EOF); the writer is trusted, the size bounded anyway."""
    try:
        return await reader.readline()
    except ValueError:
        return b""


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await proc.wait()
