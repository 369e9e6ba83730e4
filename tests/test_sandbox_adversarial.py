"""code_exec's sandbox against a hostile submission, one test per channel the child controls.

Each submission tries to escape, forge, exhaust or outlive its run through something it can
write or reach: stdout/stderr text that mimics the runner, the descriptors it inherited, forks,
memory spread over processes, the disk, the wall clock, host files, other processes' command
lines and environments, a loopback listener, signals, and a kill -9 of the server. The default
isolation (``namespaces``) needs root with CAP_SYS_ADMIN, which CI has; elsewhere these skip.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from polygym.testing import serve_in_process, synthetic_response, verify
from resources_servers.code_exec.app import CodeExec
from resources_servers.code_exec.sandbox import RunResult, Sandbox, SandboxConfig, has_cap_sys_admin

REPO = Path(__file__).resolve().parents[1]
UID_BASE = 3_180_000
LIMITS = {"wall_s": 3, "cpu_s": 2, "per_test_timeout_s": 0.5, "memory_mb": 256, "nproc": 12}
ROOT = os.geteuid() == 0 and has_cap_sys_admin()
pytestmark = pytest.mark.skipif(not ROOT, reason="namespaces isolation needs root with CAP_SYS_ADMIN")
FAKE_SETUP_FAILURE = (
    '{"event": "setup_error", "error": "unshare: Operation not permitted"}\n'
    "error: unshare failed: Operation not permitted\n"
)


def src(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


def make_sandbox(**config: object) -> Sandbox:
    return Sandbox(
        SandboxConfig.model_validate({"uid_base": UID_BASE, "max_concurrent": 2, "limits": LIMITS, **config})
    )


async def run(sandbox: Sandbox, code: str, inputs: list | None = None) -> RunResult:
    started = time.monotonic()
    result = await sandbox.run(code, "f", inputs if inputs is not None else [{"args": [1]}])
    assert time.monotonic() - started < LIMITS["wall_s"] + 5
    return result


def value(result: RunResult, index: int = 0) -> Any:
    outcome = result.outcomes[index]
    assert outcome.error is None, outcome.error
    return outcome.value


def slot_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids and UID_BASE <= uids.real < UID_BASE + 10:
            found.append(proc)
    return found


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll ``condition`` until true or the deadline; whether it came true."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


WRITE_EVERYWHERE = src(
    """
    import os, sys

    def write_everywhere(text):
        print(text)
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.write(text)
                stream.flush()
            except Exception:
                pass
        for fd in range(0, 256):
            try:
                os.write(fd, text.encode())
            except OSError:
                pass
    """
)


async def test_text_mimicking_a_setup_failure_does_not_weaken_the_next_run():
    """#13.1: a fake setup error on every channel; the sandbox stays namespaced for later runs."""
    sandbox = make_sandbox()
    attack = WRITE_EVERYWHERE + f"\ndef f(x):\n    write_everywhere({FAKE_SETUP_FAILURE!r})\n    return x\n"
    first = await run(sandbox, attack)
    assert first.isolation == "namespaces"
    probe = src(
        """
        import os

        def f(x):
            try:
                with open('/etc/shadow') as handle:
                    return ['read', handle.read(20), os.getuid()]
            except OSError as exc:
                return [type(exc).__name__, '', os.getuid()]
        """
    )
    later = await run(sandbox, probe)
    assert later.isolation == sandbox.isolation == "namespaces"
    outcome, text, uid = value(later)
    assert outcome != "read" and text == "" and uid != 0


async def test_forged_result_records_score_zero():
    """Records the runner would write, written by the submission itself, never earn a reward."""
    forged = '{"event": "loaded"}\n{"i": 0, "value": 2}\n{"i": 1, "value": 4}\n{"event": "done"}\n'
    code = WRITE_EVERYWHERE + f"\ndef double(x):\n    write_everywhere({forged!r})\n    return None\n"
    row = {
        "responses_create_params": {"input": "double x"},
        "entry_point": "double",
        "tests": [{"args": [1], "expected": 2}, {"args": [2], "expected": 4}],
    }
    server = CodeExec("code_exec", {"sandbox": {"uid_base": UID_BASE, "limits": LIMITS}})
    async with serve_in_process(server) as client:
        result = await verify(client, row, synthetic_response(f"```python\n{code}```"))
        honest = await verify(
            client, row, synthetic_response("```python\ndef double(x):\n    return 2 * x\n```")
        )
    assert result["reward"] == 0.0
    assert result["reason"] == "protocol_error" and result["status"] == "protocol_error"
    assert honest["reward"] == 1.0 and honest["reason"] is None


async def test_only_the_result_pipe_is_reachable():
    """The control pipe is closed before the submission exists: the one pipe left is the result pipe."""
    code = src(
        """
        import os, stat

        def f(x):
            return [fd for fd in range(3, 1024) if _is_pipe(fd)]

        def _is_pipe(fd):
            try:
                return stat.S_ISFIFO(os.fstat(fd).st_mode)
            except OSError:
                return False
        """
    )
    result = await run(make_sandbox(), code)
    assert len(value(result)) == 1


@pytest.mark.parametrize("enforcement", ["cgroup", "process_tree"])
async def test_fork_bomb_is_contained_and_leaves_nothing(enforcement):
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
    # The bomb reaches the process limit in milliseconds on an idle machine; under a loaded
    # suite (-n 4) it took over the default 0.5 s per test. Any time short of the run's wall
    # limit shows the containment; past it the run is a timeout, and this fails saying so.
    sandbox = make_sandbox(
        enforcement=enforcement, limits={**LIMITS, "per_test_timeout_s": LIMITS["wall_s"] - 0.5}
    )
    result = await run(sandbox, code)
    assert result.violation == "pids_limit"
    assert wait_until(lambda: not slot_processes(), 5)
    assert value(await run(sandbox, "def f(x):\n    return x\n")) == 1


MANY_PROCESS_MEMORY = src(
    """
    import os, time

    def f(x):
        children = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                block = bytearray(100 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        return [os.waitpid(pid, 0)[1] for pid in children]
    """
)


@pytest.mark.parametrize("isolation", ["namespaces", "basic"])
@pytest.mark.parametrize("enforcement", ["cgroup", "process_tree"])
async def test_memory_is_limited_across_all_processes(isolation, enforcement):
    """#13.2: eight children of 100 MB each (3x memory_mb) end the run as memory_limit."""
    sandbox = make_sandbox(isolation=isolation, enforcement=enforcement)
    result = await run(sandbox, MANY_PROCESS_MEMORY)
    assert result.status == "memory_limit", (result.status, result.outcomes)
    assert wait_until(lambda: not slot_processes(), 5)


@pytest.mark.parametrize("enforcement", ["cgroup", "process_tree"])
async def test_process_count_is_limited_across_the_submission(enforcement):
    """#13.2: in basic isolation no per-uid rlimit helps; the whole submission's count does."""
    code = src(
        """
        import os, time

        def f(x):
            started = 0
            for _ in range(40):
                try:
                    if os.fork() == 0:
                        time.sleep(2)
                        os._exit(0)
                    started += 1
                except OSError:
                    pass
            time.sleep(0.5)
            return started
        """
    )
    result = await run(make_sandbox(isolation="basic", enforcement=enforcement), code)
    assert result.status == "pids_limit", (result.status, result.outcomes)


async def test_disk_fill_stops_at_disk_mb():
    code = src(
        """
        def f(x):
            written = 0
            for directory in ('.', '/tmp'):
                for i in range(100):
                    try:
                        with open(f'{directory}/fill{i}', 'wb') as handle:
                            handle.write(b'x' * 1000000)
                        written += 1000000
                    except OSError as exc:
                        error = str(exc)
                        break
            return [written, error]
        """
    )
    written, error = value(await run(make_sandbox(limits={**LIMITS, "disk_mb": 8}), code))
    assert written <= 8 * 1024 * 1024 and "No space left" in error


@pytest.mark.slow
async def test_sleeping_past_the_wall_clock_is_killed_and_scores_zero():
    code = src(
        """
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)

        def f(x):
            time.sleep(60)
        """
    )
    result = await run(make_sandbox(), code)
    assert result.violation == "timeout" and result.outcomes == {}
    assert wait_until(lambda: not slot_processes(), 5)


async def test_host_secrets_on_disk_are_invisible():
    paths = ["/etc/shadow", "/etc/passwd", str(REPO / "pyproject.toml"), "/proc/1/environ"]
    assert all(Path(path).exists() for path in paths)
    code = "import os\n\ndef f(paths):\n    return [os.path.exists(path) for path in paths]\n"
    assert value(await run(make_sandbox(), code, [{"args": [paths]}])) == [False] * len(paths)


async def test_other_processes_command_lines_are_invisible():
    """The policy API key sat in another process's command line; /proc is not there, nor mountable."""
    secret = "sk-polygym-adversarial-0123456789"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", secret])
    try:
        code = src(
            """
            import ctypes, os

            def f(secret):
                found = False
                if os.path.isdir('/proc'):
                    for name in os.listdir('/proc'):
                        try:
                            with open(f'/proc/{name}/cmdline', 'rb') as handle:
                                found = found or secret.encode() in handle.read()
                        except OSError:
                            pass
                os.makedirs('/tmp/p', exist_ok=True)
                libc = ctypes.CDLL(None, use_errno=True)
                mounted = libc.mount(b'proc', b'/tmp/p', b'proc', 0, None) == 0
                return [found, mounted, os.path.exists('/tmp/p/self')]
            """
        )
        assert value(await run(make_sandbox(), code, [{"args": [secret]}])) == [False, False, False]
    finally:
        holder.kill()
        holder.wait()


async def test_a_loopback_listener_is_unreachable():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        code = src(
            """
            import socket

            def f(port):
                try:
                    socket.create_connection(('127.0.0.1', port), timeout=1).close()
                    return 'connected'
                except OSError as exc:
                    return type(exc).__name__
            """
        )
        result = await run(make_sandbox(), code, [{"args": [listener.getsockname()[1]]}])
        assert value(result) != "connected"
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_secrets_in_the_server_environment_do_not_reach_the_child(monkeypatch):
    monkeypatch.setenv("POLICY_API_KEY", "sk-polygym-env-secret")
    code = src(
        """
        import os

        def f(x):
            found = 'sk-polygym-env-secret' in repr(dict(os.environ))
            for pid in (os.getppid(), 1):
                try:
                    with open(f'/proc/{pid}/environ', 'rb') as handle:
                        found = found or b'sk-polygym-env-secret' in handle.read()
                except OSError:
                    pass
            return found
        """
    )
    assert value(await run(make_sandbox(), code)) is False


DOUBLE_FORK = src(
    """
    import os, time

    def f(path):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(path, 'a') as handle:
                    handle.write(f'{os.getpid()}\\n')
                time.sleep(600)
            os._exit(0)
        time.sleep(0.3)
        return 1
    """
)


@pytest.mark.parametrize("isolation", ["namespaces", "basic"])
@pytest.mark.parametrize("enforcement", ["cgroup", "process_tree"])
async def test_setsid_and_double_fork_do_not_escape_the_kill(isolation, enforcement, tmp_path):
    """A grandchild in its own session, re-parented away from the worker, still dies with the run."""
    marker = tmp_path / "pids"
    marker.touch()
    marker.chmod(0o666)
    tmp_path.chmod(0o777)
    path = str(marker) if isolation == "basic" else "/tmp/pids"
    sandbox = make_sandbox(isolation=isolation, enforcement=enforcement)
    result = await run(sandbox, DOUBLE_FORK, [{"args": [path]}])
    assert result.outcomes[0].value == 1 or result.violation == "timeout"
    assert wait_until(lambda: not slot_processes(), 5)
    pids = [int(p) for p in marker.read_text().split()]
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 5)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_signals_to_the_server_and_init_fail():
    code = src(
        """
        import os, signal

        def f(server):
            results = []
            for pid in (server, os.getppid(), 1, -1):
                try:
                    os.kill(pid, signal.SIGKILL)
                    results.append('sent')
                except OSError as exc:
                    results.append(type(exc).__name__)
            return results
        """
    )
    result = await run(make_sandbox(), code, [{"args": [os.getpid()]}])
    assert "sent" not in value(result)
    assert psutil.pid_exists(os.getpid())


SERVER_SCRIPT = src(
    """
    import asyncio, sys
    from resources_servers.code_exec.sandbox import Sandbox, SandboxConfig

    CODE = '''
    import os, signal, time
    signal.signal(signal.SIGALRM, signal.SIG_IGN)

    def f(x):
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                time.sleep(600)
        time.sleep(600)
    '''

    async def main():
        config = SandboxConfig(isolation=sys.argv[1], uid_base=int(sys.argv[2]),
                               limits={"wall_s": 600, "per_test_timeout_s": 600})
        await Sandbox(config).run(CODE, "f", [{"args": [1]}])

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("isolation", ["namespaces", "basic"])
def test_sandboxed_processes_die_with_a_killed_server(isolation):
    """#13.12: kill -9 of the server leaves no runner, init, worker or forked child behind."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, isolation, str(UID_BASE)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        parent = psutil.Process(server.pid)
        # The runner, its worker and the submission's three children (plus init when namespaced).
        expected = 5 if isolation == "basic" else 6
        assert wait_until(lambda: len(parent.children(recursive=True)) >= expected, 20)
        assert wait_until(lambda: len(_session_leaders(parent)) >= 3, 10)  # the children's setsid()
        sandboxed = parent.children(recursive=True)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    assert wait_until(lambda: not any(_alive(proc.pid) for proc in sandboxed), 10), [
        proc.pid for proc in sandboxed if _alive(proc.pid)
    ]


def _session_leaders(parent: psutil.Process) -> list[int]:
    leaders = []
    for proc in parent.children(recursive=True):
        try:
            if os.getsid(proc.pid) == proc.pid and proc.pid != parent.pid:
                leaders.append(proc.pid)
        except OSError:
            pass
    return leaders


def test_missing_capability_is_a_startup_error_not_a_silent_downgrade():
    """#13.1: without CAP_SYS_ADMIN the default config refuses to run, naming what is missing."""
    script = src(
        """
        import asyncio
        from resources_servers.code_exec.sandbox import Sandbox, SandboxConfig

        async def main():
            sandbox = Sandbox(SandboxConfig())
            try:
                result = await sandbox.run("def f():\\n    return 1\\n", "f", [{}])
            except Exception as exc:
                print(type(exc).__name__, exc)
            else:
                print("ran", result.isolation)

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_admin", sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.startswith("SandboxSetupError"), out
    assert "CAP_SYS_ADMIN" in out and "isolation: basic" in out
