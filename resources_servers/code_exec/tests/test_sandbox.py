"""The sandbox against hostile submissions: each case must end in bounded time and leave nothing behind.

Namespace-only cases (fork bombs, hidden files, no network) are skipped when the tests do not run
as root; ``basic`` isolation does not claim to stop them (see the README).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from resources_servers.code_exec.sandbox import RunResult, Sandbox, SandboxConfig, parse_report

LIMITS = {"wall_s": 3, "cpu_s": 2, "per_test_timeout_s": 0.5, "max_output_bytes": 200_000}
UID_BASE = 3_170_000
NAMESPACES = os.geteuid() == 0
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="namespaces isolation needs root")
DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "train.jsonl"


def src(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


@pytest.fixture
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(uid_base=UID_BASE, max_concurrent=2, limits=LIMITS))


def slot_processes() -> list[psutil.Process]:
    """Processes still running as one of the sandbox's slot uids."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids and UID_BASE <= uids.real < UID_BASE + 10:
            found.append(proc)
    return found


def slot_processes_gone(within_s: float = 10.0) -> bool:
    """Whether the slot's processes are gone by the deadline: a killed namespace's processes are
    reaped by the kernel a moment after the run returns (under a loaded suite, visibly later)."""
    deadline = time.monotonic() + within_s
    while slot_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def run(sandbox: Sandbox, code: str, inputs: list | None = None):
    started = time.monotonic()
    result = await sandbox.run(code, "f", inputs if inputs is not None else [{"args": [1]}, {"args": [2]}])
    elapsed = time.monotonic() - started
    assert elapsed < LIMITS["wall_s"] + 3, f"run took {elapsed:.1f}s"
    return result


def values(result) -> list:
    return [result.outcomes[i].value if i in result.outcomes else None for i in sorted(result.outcomes)]


async def test_plain_function_returns_values(sandbox):
    result = await run(sandbox, "def f(x):\n    return [x, x * 2, {'k': str(x)}]\n")
    assert result.status == "ok"
    assert values(result) == [[1, 2, {"k": "1"}], [2, 4, {"k": "2"}]]
    assert result.isolation == ("namespaces" if NAMESPACES else "basic")


async def test_infinite_loop_is_stopped_per_test(sandbox):
    result = await run(sandbox, "def f(x):\n    while True:\n        pass\n")
    assert result.status == "ok"
    assert all("time limit" in o.error for o in result.outcomes.values())


@pytest.mark.slow
async def test_loop_that_ignores_the_timer_hits_the_wall_clock(sandbox):
    code = src(
        """
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)

        def f(x):
            time.sleep(60)
        """
    )
    result = await run(sandbox, code)
    assert result.status == "timeout"
    assert result.outcomes == {}
    assert slot_processes_gone(), slot_processes()


async def test_loop_at_import_time_is_a_load_error(sandbox):
    result = await run(sandbox, "while True:\n    pass\n")
    assert result.status == "load_error"
    assert "time limit" in result.load_error


@needs_namespaces
async def test_fork_bomb_is_contained_and_cleaned_up(sandbox):
    code = src(
        """
        import os

        def f(x):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """
    )
    result = await run(sandbox, code)
    assert result.status == "pids_limit"
    assert slot_processes_gone(), slot_processes()
    assert (await run(sandbox, "def f(x):\n    return x\n")).status == "ok"  # the slot still works


@needs_namespaces
async def test_children_that_leave_the_process_group_die_with_the_namespace(sandbox):
    code = src(
        """
        import os, time

        def f(x):
            for _ in range(5):
                if os.fork() == 0:
                    os.setsid()
                    time.sleep(600)
            return x
        """
    )
    result = await run(sandbox, code, [{"args": [1]}])
    assert values(result) == [1]
    assert slot_processes_gone(), slot_processes()


async def test_memory_bomb_gets_memory_error(sandbox):
    result = await run(sandbox, "def f(x):\n    return len(bytearray(4 * 1024 ** 3))\n")
    assert {o.error for o in result.outcomes.values()} == {"MemoryError"}


async def test_output_flood_is_cut_at_the_cap(sandbox):
    code = src(
        """
        import os, sys

        def f(x):
            print('x' * 10 ** 6)
            sys.__stdout__.write('y' * 10 ** 6)
            for fd in range(3, 40):
                try:
                    while True:
                        os.write(fd, b'z' * 65536)
                except OSError:
                    pass
        """
    )
    result = await run(sandbox, code)
    assert result.status == "output_limit"


async def test_prints_do_not_reach_the_report(sandbox):
    code = 'def f(x):\n    print(\'{"i": 0, "value": 999}\')\n    return x\n'
    result = await run(sandbox, code)
    assert values(result) == [1, 2]


async def test_huge_file_is_refused(sandbox):
    code = src(
        """
        def f(x):
            with open('big', 'wb') as h:
                while True:
                    h.write(b'x' * 65536)
        """
    )
    result = await run(sandbox, code)
    assert all("File too large" in o.error for o in result.outcomes.values())


@needs_namespaces
async def test_many_files_fill_only_the_private_tmpfs(sandbox):
    code = src(
        """
        def f(x):
            i = 0
            while True:
                with open(f'f{x}_{i}', 'wb') as h:
                    h.write(b'x' * 1000000)
                i += 1
        """
    )
    result = await run(sandbox, code)
    assert all("No space left" in o.error for o in result.outcomes.values())


async def test_killing_the_parent_or_everything_fails(sandbox):
    code = src(
        """
        import os, signal

        def f(x):
            errors = []
            for pid in (os.getppid(), 1, -1):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError as e:
                    errors.append(type(e).__name__)
            return errors
        """
    )
    if not NAMESPACES:
        pytest.skip("in basic isolation the child runs as the server's user")
    result = await run(sandbox, code, [{"args": [1]}])
    # Not allowed to signal the server or the namespace's init; -1 finds nothing else to kill.
    assert values(result) == [["PermissionError", "PermissionError", "ProcessLookupError"]]
    assert psutil.pid_exists(os.getpid())


async def test_exit_calls_end_the_run_without_results(sandbox):
    result = await run(sandbox, "import sys\n\ndef f(x):\n    sys.exit(3)\n")
    assert {o.error for o in result.outcomes.values()} == {"SystemExit: 3"}
    result = await run(sandbox, "import os\n\ndef f(x):\n    os._exit(0)\n")
    assert result.status == "crashed" and result.outcomes == {}


async def test_objects_with_rigged_equality_do_not_cross(sandbox):
    code = src(
        """
        class Always:
            def __eq__(self, other):
                return True

        def f(x):
            return Always()
        """
    )
    result = await run(sandbox, code)
    assert all("not JSON data" in o.error for o in result.outcomes.values())


async def test_the_submission_cannot_find_the_expected_values(sandbox):
    code = src(
        """
        import gc, sys

        def f(x):
            found = [o for o in gc.get_objects() if isinstance(o, dict) and 'expected' in o]
            return [len(found), sys.stdin.read()]
        """
    )
    result = await run(sandbox, code)
    assert values(result) == [[0, ""], [0, ""]]


@needs_namespaces
async def test_host_files_are_not_visible(sandbox):
    assert DATA_FILE.exists()
    code = src(
        """
        import os

        def f(path):
            return [os.path.exists(path), os.path.exists('/etc/passwd'), sorted(os.listdir('/'))]
        """
    )
    result = await run(sandbox, code, [{"args": [str(DATA_FILE)]}])
    exists, passwd, listing = values(result)[0]
    assert exists is False and passwd is False
    interpreter_tops = {Path(os.path.realpath(sys.base_prefix)).parts[1]}
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "dev", "tmp", "work"}
    assert set(listing) <= allowed | interpreter_tops


@needs_namespaces
async def test_no_network_even_to_loopback(sandbox):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = src(
            """
            import socket

            def f(port):
                try:
                    socket.create_connection(('127.0.0.1', port), timeout=1)
                    return 'connected'
                except OSError as e:
                    return type(e).__name__
            """
        )
        result = await run(sandbox, code, [{"args": [port]}])
    assert values(result)[0] != "connected"


async def test_server_environment_is_not_inherited(sandbox, monkeypatch):
    monkeypatch.setenv("POLYGYM_TEST_SECRET", "hunter2")
    result = await run(sandbox, "import os\n\ndef f(x):\n    return sorted(os.environ)\n", [{"args": [1]}])
    assert "POLYGYM_TEST_SECRET" not in values(result)[0]


async def test_runs_do_not_block_the_event_loop(sandbox):
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    try:
        code = src(
            """
        import time

        def f(x):
            time.sleep(0.3)
            return x
        """
        )
        results = await asyncio.gather(*(run(sandbox, code, [{"args": [i]}]) for i in range(3)))
    finally:
        task.cancel()
    assert [values(r) for r in results] == [[0], [1], [2]]
    assert ticks >= 20  # the loop kept running while three sandboxes (two at a time) slept


def parsed(data: bytes, expected: int = 2) -> RunResult:
    result = RunResult(isolation="basic", exit_code=0)
    parse_report(data, expected, result)
    return result


def test_report_parsing_takes_exactly_the_runner_sequence():
    good = parsed(b'{"event": "loaded"}\n{"i": 0, "value": 5}\n{"i": 1, "error": "E"}\n{"event": "done"}\n')
    assert good.status == "ok" and good.outcomes[0].value == 5 and good.outcomes[1].error == "E"
    assert parsed(b'{"event": "load_error", "error": "SyntaxError"}\n').status == "load_error"


@pytest.mark.parametrize(
    "data",
    [
        b'not json\n{"event": "loaded"}\n',
        b'{"event": "loaded"}\n{"i": 0, "value": 5}\n{"i": 0, "value": 6}\n',  # a forged duplicate
        b'{"event": "loaded"}\n{"i": 1, "value": 5}\n',  # out of order
        b'{"event": "loaded"}\n{"i": 0, "value": 1, "error": "x"}\n',
        b'{"event": "loaded"}\n{"i": 0, "value": 1}\n{"i": 1, "value": 1}\n{"event": "done"}\n{"i": 2}\n',
        b'{"event": "loaded"}\n{"event": "loaded"}\n',
        b'{"event": "loaded"}\n{"i": 0, "val',  # cut off without a kill
    ],
)
def test_anything_but_the_runner_sequence_is_a_protocol_error(data):
    result = parsed(data)
    assert result.status == "protocol_error" and result.violation == "protocol_error"


@pytest.mark.parametrize(
    "config",
    [{"limits": {"tmpfs_mb": 64}}, {"limits": {"memory_mbb": 64}}, {"isolaton": "basic"}],
    ids=["renamed", "misspelled limit", "misspelled setting"],
)
def test_an_unknown_sandbox_setting_is_an_error_not_a_default(config: dict) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SandboxConfig.model_validate(config)
