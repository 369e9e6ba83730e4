"""The program that runs one untrusted submission: ``python -I -S sandbox_runner.py`` (stdlib only).

It is started by ``sandbox.py`` and reads one JSON payload from stdin (the code, the function
name, the test *inputs*, the limits, the numbers of two pipe descriptors the server created). Its
stdout and stderr go nowhere; it talks to the server on those two pipes only:

- the **control pipe** carries one line, ``ready`` or ``error: <why>``, written by this trusted
  code *before* the submission exists; every copy of the descriptor is closed before the
  submission's code is compiled, so nothing the submission does can ever write on it (the server
  reads one line and nothing more). A failed setup is therefore always the sandbox's, never a
  submission's trick;
- the **result pipe** carries JSON lines: ``{"event": "loaded"}`` or ``{"event": "load_error"}``,
  then ``{"i": k, "value": v}`` / ``{"i": k, "error": e}`` for k = 0, 1, ... and
  ``{"event": "done"}``. The submission shares this process and can write here too; the server
  treats the pipe as the submission's claims: only exact, in-order records count, anything else
  scores 0, and a forged value is still compared with expected values that never reach this
  process (introspection, caller frames or re-reading stdin find nothing).

Before anything else the runner asks for SIGKILL when its parent (the server) dies and checks that
the parent is still the server (closing the race with a kill -9 just before), becomes a child
subreaper (orphans that ``setsid`` or double-fork stay in its tree, where the server can find
them), and joins the run's cgroups when the server made some.

Isolation ``namespaces`` (root with CAP_SYS_ADMIN): the runner unshares mount, network, PID, IPC
and UTS namespaces and forks an init process (PID 1 of the new PID namespace), which dies with the
runner, builds a root on a size-limited tmpfs (read-only bind mounts of ``/usr``, the interpreter's
prefix and a few device files; no ``/etc``, no ``/proc``, not the repository or the datasets),
chroots into it and forks the worker. The worker sets resource limits, drops to a dedicated
unprivileged uid, sets ``no_new_privs`` and runs the submission. When init exits, the kernel kills
every process left in the namespace, so a fork bomb that called ``setsid`` dies with it.

In both isolations the worker installs a seccomp filter before the submission exists
(``forbid_uncounted_memory``): ``memfd_create``, ``memfd_secret``, ``shmget`` and ``msgget`` fail
with EPERM, because what they allocate is in no process's resident set, where the process-tree
poll looks, and a SysV segment would outlive a ``basic`` run on the host.

Isolation ``basic`` (explicit opt-in): resource limits, a fresh working directory, a minimal
environment, the cgroup or process-tree limits, and the parent-death signal; the submission runs
as the server's user. See the README for what it does not stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import resource
import select
import signal
import sys
import traceback
from collections.abc import Callable

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
SECCOMP_RET_KILL_PROCESS = 0x80000000
X32_SYSCALL_BIT = 0x40000000
BPF_LD_ABS_W, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
UNCOUNTED_MEMORY_SYSCALLS = {
    # machine: (AUDIT_ARCH_*, (memfd_create, memfd_secret, shmget, msgget))
    "x86_64": (0xC000003E, (319, 447, 29, 68)),
    "aarch64": (0xC00000B7, (279, 447, 194, 186)),
}

SANDBOX_ROOT = "/tmp"  # mount point of the tmpfs root, inside the private mount namespace only
DEVICES = ("null", "zero", "random", "urandom")

SETUP_FAILED = 70
KILL_ROUNDS = 200
NAMESPACES_NEED = (
    "namespaces isolation needs root with CAP_SYS_ADMIN (unshare CLONE_NEWNS/NEWPID/NEWNET/NEWIPC/NEWUTS)"
)

_OUT_FD = -1
_CONTROL_FD = -1


class SetupError(Exception):
    """The sandbox could not be built; reported on the control pipe, never by the submission."""


def _write_all(fd: int, data: bytes) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def report_setup(error: BaseException | str) -> None:
    """``error: ...`` on the control pipe (one line), if this process still holds it."""
    if _CONTROL_FD < 0:
        return
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    with contextlib.suppress(OSError):
        _write_all(_CONTROL_FD, ("error: " + " ".join(text.split())[:2000] + "\n").encode("utf-8", "replace"))


def report_ready() -> None:
    """The last trusted word: ``ready``, then the control pipe is closed for good in this process."""
    global _CONTROL_FD
    _write_all(_CONTROL_FD, b"ready\n")
    os.close(_CONTROL_FD)
    _CONTROL_FD = -1


def close_control() -> None:
    """Drop this process's copy of the control pipe (init and the outer runner, once forked)."""
    global _CONTROL_FD
    if _CONTROL_FD >= 0:
        os.close(_CONTROL_FD)
        _CONTROL_FD = -1


def emit(record: dict) -> None:
    """One JSON line on the result pipe, written in one call so lines never interleave."""
    try:
        line = json.dumps(record)
    except (TypeError, ValueError):
        line = json.dumps({k: v for k, v in record.items() if k != "value"} | {"error": "unserializable"})
    _write_all(_OUT_FD, (line + "\n").encode("utf-8", "replace"))


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int, data: str = ""
) -> None:
    _check(
        libc.mount(
            src.encode() if src else None,
            dst.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {src} on {dst}",
    )


def _bind_readonly(libc: ctypes.CDLL, src: str, dst: str) -> None:
    _mount(libc, src, dst, None, MS_BIND)
    _mount(libc, None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _interpreter_dirs() -> list[str]:
    """Directories the interpreter needs at run time that ``/usr`` does not already cover."""
    dirs = set()
    for path in (sys.base_prefix, sys.base_exec_prefix):
        real = os.path.realpath(path)
        if real != "/usr" and not real.startswith("/usr/"):
            dirs.add(real)
    return sorted(dirs)


def build_root(libc: ctypes.CDLL, uid: int, disk_bytes: int) -> None:
    """Inside the new mount namespace: a tmpfs root with only what Python needs, then chroot."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    root = SANDBOX_ROOT
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=755")
    os.mkdir(f"{root}/usr")
    _bind_readonly(libc, "/usr", f"{root}/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif os.path.isdir(host):
            os.mkdir(f"{root}/{name}")
            _bind_readonly(libc, host, f"{root}/{name}")
    for path in _interpreter_dirs():
        os.makedirs(f"{root}{path}", mode=0o755, exist_ok=True)
        _bind_readonly(libc, path, f"{root}{path}")
    os.mkdir(f"{root}/dev")
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            open(f"{root}/dev/{device}", "w").close()
            _mount(libc, f"/dev/{device}", f"{root}/dev/{device}", None, MS_BIND)
    os.mkdir(f"{root}/tmp")
    os.chmod(f"{root}/tmp", 0o1777)
    os.mkdir(f"{root}/work", 0o700)
    os.chown(f"{root}/work", uid, uid)
    os.chroot(root)
    os.chdir("/work")


def set_limits(limits: dict, with_nproc: bool) -> None:
    cpu = max(1, int(limits["cpu_s"]))
    pairs = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (limits["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (limits["file_bytes"],) * 2,
        resource.RLIMIT_NOFILE: (limits["nofile"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if with_nproc:
        # One above the whole-submission limit, so that the cgroup or the process-tree poll, which
        # the server can observe (and score 0), is what stops a fork bomb; this is the backstop.
        pairs[resource.RLIMIT_NPROC] = (limits["nproc"] + 1,) * 2
    for which, (soft, hard) in pairs.items():
        resource.setrlimit(which, (soft, hard))


def drop_privileges(libc: ctypes.CDLL, uid: int) -> None:
    """The slot's uid with no groups; a change of credentials clears PDEATHSIG, so it is set again after."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def forbid_uncounted_memory(libc: ctypes.CDLL) -> None:
    """Make ``memfd_create``, ``memfd_secret``, ``shmget`` and ``msgget`` fail with EPERM here and in
    every descendant (a seccomp filter; ``no_new_privs`` must be set).

    Memory behind those calls is in no process's resident set once written with ``write`` or
    detached, so the process-tree poll cannot see it, and in ``basic`` isolation a SysV segment
    outlives the run on the host. A system call of another ABI (i386, x32) kills the process:
    the numbers above are for this one. A machine not listed cannot have the filter, which the
    sandbox's startup probe reports as a setup error rather than running without it.
    """
    machine = os.uname().machine
    if machine not in UNCOUNTED_MEMORY_SYSCALLS:
        raise SetupError(f"no seccomp filter for {machine}: submissions could hold memory no limit sees")
    arch, numbers = UNCOUNTED_MEMORY_SYSCALLS[machine]
    n = len(numbers)
    deny, kill = 5 + n, 6 + n  # where the EPERM and kill returns are
    program = [
        (BPF_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 0, kill - 2, arch),
        (BPF_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (BPF_JGE_K, deny - 4, 0, X32_SYSCALL_BIT),
        *((BPF_JEQ_K, deny - (5 + i), 0, number) for i, number in enumerate(numbers)),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, SECCOMP_RET_EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ]
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    fprog = _SockFprog(len(program), filters)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(SECCOMP)")


def wait_for(pid: int) -> int:
    """Reap children (as PID 1 and as a subreaper adopt orphans) until ``pid`` ends; its exit code."""
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            return 1
        if child == pid:
            return os.waitstatus_to_exitcode(status)


def die_with_parent(libc: ctypes.CDLL, alive: Callable[[], bool]) -> None:
    """SIGKILL when the parent dies; if it already died (before the prctl), exit now."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if not alive():
        os._exit(SETUP_FAILED)


def _lifeline_open(read_end: int) -> bool:
    """True while the other end of a pipe is held open (the outer runner alive)."""
    readable, _, _ = select.select([read_end], [], [], 0)
    return not readable


def run_namespaced(payload: dict, libc: ctypes.CDLL) -> int:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{NAMESPACES_NEED}: unshare failed: {os.strerror(err)}")
    lifeline_read, lifeline_write = os.pipe()
    init = os.fork()
    if init:
        os.close(lifeline_read)
        close_control()
        os.close(_OUT_FD)
        return wait_for(init)
    # PID 1 of the new namespace; stays root (it only waits) and dies with the outer runner.
    os.close(lifeline_write)
    code = SETUP_FAILED
    try:
        die_with_parent(libc, lambda: _lifeline_open(lifeline_read))
        uid = int(payload["uid"])
        build_root(libc, uid, int(payload["limits"]["disk_bytes"]))
        worker = os.fork()
        if worker == 0:
            os.close(lifeline_read)
            try:
                set_limits(payload["limits"], with_nproc=True)
                drop_privileges(libc, uid)
                forbid_uncounted_memory(libc)
                die_with_parent(libc, lambda: os.getppid() == 1)
            except BaseException as exc:
                report_setup(exc)
                os._exit(SETUP_FAILED)
            os._exit(run_tests(payload))
        close_control()
        os.close(_OUT_FD)
        code = wait_for(worker)
    except BaseException as exc:
        report_setup(exc)
    os._exit(code)


def run_basic(payload: dict, libc: ctypes.CDLL) -> int:
    """Fork the worker and stay as its supervisor: a subreaper that kills every descendant left.

    The supervisor runs no submission code. Its parent-death signal is SIGTERM, handled, so that
    when the server dies it takes the whole tree with it (orphans re-parent to it, where it can
    find them) rather than dying alone.
    """
    workdir = payload.get("workdir")
    if workdir:
        os.chdir(workdir)
    supervisor = os.getpid()
    worker = os.fork()
    if worker == 0:
        try:
            die_with_parent(libc, lambda: os.getppid() == supervisor)
            set_limits(payload["limits"], with_nproc=False)
            _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
            forbid_uncounted_memory(libc)
        except BaseException as exc:
            report_setup(exc)
            os._exit(SETUP_FAILED)
        os._exit(run_tests(payload))
    close_control()
    os.close(_OUT_FD)
    signal.signal(signal.SIGTERM, _on_parent_death)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl(PDEATHSIG)")
    code = wait_for(worker)
    kill_descendants()
    return code


def _on_parent_death(signum: int, frame: object) -> None:
    kill_descendants()
    os._exit(SETUP_FAILED)


def _children() -> list[int]:
    """This process's children, from /proc (the stdlib has no other way to list them)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def kill_descendants() -> None:
    """Kill and reap children until none is left; as a subreaper, grandchildren come up in turn."""
    for _ in range(KILL_ROUNDS):
        children = _children()
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


class CappedText(io.TextIOBase):
    """Where the submission's ``print`` goes: kept up to a cap, then dropped (never the result pipe)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.size = min(self.cap, self.size + len(text))
        return len(text)


class TestTimeout(BaseException):
    """Raised in the submission by the per-test timer (BaseException: ``except Exception`` won't eat it)."""


def _on_alarm(signum: int, frame: object) -> None:
    raise TestTimeout()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TestTimeout):
        return "TimeoutError: the test ran past its time limit"
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-2000:]


def _encode(value: object, max_chars: int) -> dict:
    """``{"value": v}`` when v is plain JSON data of a sane size, else ``{"error": why}``.

    Only JSON crosses back, so an object with a rigged ``__eq__`` cannot pass a test.
    """
    try:
        encoded = json.dumps(value)
    except BaseException as exc:
        return {"error": f"the return value is not JSON data ({type(value).__name__}): {str(exc)[:200]}"}
    if len(encoded) > max_chars:
        return {"error": f"the return value is too large ({len(encoded)} characters of JSON)"}
    return {"value": json.loads(encoded)}


def run_tests(payload: dict) -> int:
    """Say ``ready``, then load the submission, call the entry point on every input, report each."""
    global _OUT_FD
    # fds 0-2 go to /dev/null and sys.stdout/stderr to a capped in-memory sink; the result pipe
    # stays on the descriptor the server gave (the submission may find it: see the docstring).
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    limits = payload["limits"]
    sink = CappedText(int(limits.get("max_print_chars", 10000)))
    sys.stdout = sys.stderr = sink
    sys.stdin = io.StringIO("")
    report_ready()
    per_test = float(limits["per_test_timeout_s"])
    signal.signal(signal.SIGALRM, _on_alarm)
    namespace: dict = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        signal.setitimer(signal.ITIMER_REAL, per_test)
        exec(compile(payload["code"], "solution.py", "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        emit({"event": "load_error", "error": _describe(exc)})
        return 0
    function = namespace.get(payload["entry_point"])
    if not callable(function):
        emit(
            {"event": "load_error", "error": f"the code defines no function named {payload['entry_point']!r}"}
        )
        return 0
    emit({"event": "loaded"})
    max_chars = int(limits.get("max_value_chars", 100000))
    for index, case in enumerate(payload["inputs"]):
        record: dict = {"i": index}
        try:
            signal.setitimer(signal.ITIMER_REAL, per_test)
            value = function(*case.get("args", []), **case.get("kwargs", {}))
            signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            record["error"] = _describe(exc)
        else:
            record.update(_encode(value, max_chars))
        emit(record)
    emit({"event": "done"})
    return 0


def main() -> int:
    global _OUT_FD, _CONTROL_FD
    payload = json.loads(sys.stdin.buffer.read())
    _CONTROL_FD, _OUT_FD = int(payload["control_fd"]), int(payload["result_fd"])
    try:
        libc = _libc()
        die_with_parent(libc, lambda: os.getppid() == int(payload["parent_pid"]))
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        for procs in payload.get("cgroups", []):
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        if payload.get("isolation") == "namespaces":
            return run_namespaced(payload, libc)
        return run_basic(payload, libc)
    except BaseException as exc:
        report_setup(exc)
        return SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main())
