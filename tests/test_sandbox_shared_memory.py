"""code_exec's ``process_tree`` enforcement against memory no process's RSS shows (issue 33, M1).

A file made by ``memfd_create`` and written with ``write`` lives in the kernel's shared memory, in
no process's resident set; so does a SysV segment once detached. The process-tree poll sums
resident memory, so a submission holding either scored ``ok`` at many times ``memory_mb``. Under
``process_tree`` the runner now forbids those calls (a seccomp filter: ``EPERM``); a cgroup
charges such pages to the run, so ``cgroup`` enforcement needs no filter.

Each submission tries to hold 96 MiB under ``memory_mb: 64``, keeps it past several polls, and
reports what it held; nothing is left behind (the memfds close with the process, the segment is
removed before returning).
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from resources_servers.code_exec.sandbox import RunResult, Sandbox, SandboxConfig, has_cap_sys_admin

UID_BASE = 3_190_000
MEMORY_MB = 64
ROOT = os.geteuid() == 0 and has_cap_sys_admin()
LIMITS = {"wall_s": 5, "cpu_s": 3, "per_test_timeout_s": 3, "memory_mb": MEMORY_MB, "nproc": 8}
pytestmark = pytest.mark.skipif(
    not ROOT, reason="the sandbox's namespaces isolation needs root with CAP_SYS_ADMIN"
)

MEMFD = textwrap.dedent(
    """
    import os, time

    def f(x):
        fds, error = [], None
        try:
            for _ in range(24):
                fd = os.memfd_create("hold")
                fds.append(fd)
                os.write(fd, b"x" * (4 * 1024 * 1024))
        except OSError as exc:
            error = exc.strerror
        time.sleep(0.3)
        return {"held_mb": 4 * len(fds) if error is None else 0, "error": error}
    """
)

SYSV = textwrap.dedent(
    """
    import ctypes, time

    def f(x):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        size, segments = 16 * 1024 * 1024, []
        for _ in range(6):  # filled one at a time: never more than 16 MiB resident at once
            segment = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if segment < 0:
                return {"held_mb": 0, "error": ctypes.get_errno()}
            segments.append(segment)
            address = libc.shmat(segment, None, 0)
            ctypes.memset(address, 1, size)
            libc.shmdt(ctypes.c_void_p(address))
        time.sleep(0.3)
        for segment in segments:
            libc.shmctl(segment, 0, None)  # IPC_RMID: nothing left behind
        return {"held_mb": 16 * len(segments), "error": None}
    """
)


def make_sandbox(isolation: str) -> Sandbox:
    config = {
        "isolation": isolation,
        "enforcement": "process_tree",
        "uid_base": UID_BASE,
        "max_concurrent": 1,
        "limits": LIMITS,
    }
    return Sandbox(SandboxConfig.model_validate(config))


async def run(sandbox: Sandbox, code: str) -> RunResult:
    started = time.monotonic()
    result = await sandbox.run(code, "f", [{"args": [1]}])
    assert time.monotonic() - started < LIMITS["wall_s"] + 5
    return result


def held_beyond_the_limit_and_ok(result: RunResult) -> bool:
    outcome = result.outcomes.get(0)
    held = outcome.value["held_mb"] if outcome is not None and isinstance(outcome.value, dict) else 0
    return result.status == "ok" and held > MEMORY_MB


@pytest.mark.parametrize("isolation", ["namespaces", "basic"])
@pytest.mark.parametrize("code", [MEMFD, SYSV], ids=["memfd", "sysv"])
async def test_memory_outside_every_rss_is_not_held_under_process_tree(isolation: str, code: str) -> None:
    sandbox = make_sandbox(isolation)
    result = await run(sandbox, code)
    assert not held_beyond_the_limit_and_ok(result), (result.status, result.outcomes)
    outcome = result.outcomes[0]
    assert outcome.value["held_mb"] == 0 and outcome.value["error"] in ("Operation not permitted", 1)


@pytest.mark.parametrize("isolation", ["namespaces", "basic"])
async def test_ordinary_code_still_runs_under_the_filter(isolation: str) -> None:
    code = "import os, json\n\ndef f(x):\n    r, w = os.pipe()\n    return json.dumps([x, os.getpid() > 0])\n"
    result = await run(make_sandbox(isolation), code)
    assert result.status == "ok" and result.outcomes[0].value == "[1, true]"
