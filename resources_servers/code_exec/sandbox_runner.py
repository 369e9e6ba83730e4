"""The program that runs one untrusted submission: ``python -I -S sandbox_runner.py`` (stdlib only).

It is started by ``sandbox.py`` as root or as a normal user, reads one JSON payload from stdin
(the code, the function name, the test *inputs*, the limits) and writes JSON lines to stdout:

    {"event": "ready", "isolation": "namespaces"}
    {"event": "loaded"}                      or {"event": "load_error", "error": "..."}
    {"i": 0, "value": <the function's return value>}   or {"i": 0, "error": "..."}
    ...
    {"event": "done"}

The expected outputs never reach this process: the parent compares the returned values, so no
amount of introspection (``gc.get_objects()``, caller frames, reading stdin again) lets a
submission find the answers, and a forged result line only claims a value the parent still checks.

Isolation ``namespaces`` (needs root, i.e. CAP_SYS_ADMIN): the process unshares mount, network,
PID, IPC and UTS namespaces and forks an init process (PID 1 of the new PID namespace) which builds
a root on a size-limited tmpfs (read-only bind mounts of ``/usr``, the interpreter's prefix and a
few device files; nothing else of the host is visible: not the repository, not ``/root``, not the
datasets), chroots into it and forks the worker. The worker sets resource limits, drops to a
dedicated unprivileged uid, sets ``no_new_privs`` and runs the submission. When the init process
exits — because the worker ended or because the parent killed the process group — the kernel kills
every process left in the namespace, so a fork bomb that called ``setsid`` dies with it.

Isolation ``basic`` (anything else): resource limits, a fresh working directory, a minimal
environment and a process group the parent kills. See the README for what it does not stop.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import resource
import signal
import sys
import traceback

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
PR_SET_NO_NEW_PRIVS = 38

SANDBOX_ROOT = "/tmp"  # mount point of the tmpfs root, inside the private mount namespace only
DEVICES = ("null", "zero", "random", "urandom")

_OUT_FD = 1


def emit(record: dict) -> None:
    """One JSON line on the result pipe, written in one call so lines never interleave."""
    try:
        line = json.dumps(record)
    except (TypeError, ValueError):
        line = json.dumps({k: v for k, v in record.items() if k != "value"} | {"error": "unserializable"})
    data = (line + "\n").encode("utf-8", "replace")
    while data:
        written = os.write(_OUT_FD, data)
        data = data[written:]


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


def build_root(libc: ctypes.CDLL, uid: int, tmpfs_bytes: int) -> None:
    """Inside the new mount namespace: a tmpfs root with only what Python needs, then chroot."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    root = SANDBOX_ROOT
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=755")
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
        pairs[resource.RLIMIT_NPROC] = (limits["nproc"],) * 2
    for which, (soft, hard) in pairs.items():
        resource.setrlimit(which, (soft, hard))


def drop_privileges(libc: ctypes.CDLL, uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")


def wait_for(pid: int) -> int:
    """Reap children (as PID 1 adopts orphans) until ``pid`` ends; its exit code."""
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            return 1
        if child == pid:
            return os.waitstatus_to_exitcode(status)


def run_namespaced(payload: dict) -> int:
    libc = _libc()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        _check(libc.unshare(flags), "unshare")
    except OSError as exc:
        emit({"event": "setup_error", "error": str(exc)})
        return 70
    init = os.fork()
    if init:
        return wait_for(init)
    # PID 1 of the new namespace; stays root (it only waits), dies with its parent.
    code = 70
    try:
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        uid = int(payload["uid"])
        build_root(libc, uid, int(payload["limits"]["tmpfs_bytes"]))
        worker = os.fork()
        if worker == 0:
            try:
                set_limits(payload["limits"], with_nproc=True)
                drop_privileges(libc, uid)
            except BaseException as exc:
                emit({"event": "setup_error", "error": f"{type(exc).__name__}: {exc}"})
                os._exit(70)
            os._exit(run_tests(payload, "namespaces"))
        code = wait_for(worker)
    except BaseException as exc:
        emit({"event": "setup_error", "error": f"{type(exc).__name__}: {exc}"})
    os._exit(code)


def run_basic(payload: dict) -> int:
    workdir = payload.get("workdir")
    if workdir:
        os.chdir(workdir)
    set_limits(payload["limits"], with_nproc=False)
    return run_tests(payload, "basic")


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


def run_tests(payload: dict, isolation: str) -> int:
    """Load the submission, call the entry point on every input, report each value or error."""
    global _OUT_FD
    # Keep the result pipe on a private descriptor; the submission's fds 1 and 2 go to /dev/null
    # and its sys.stdout/stderr to a capped in-memory sink.
    _OUT_FD = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    limits = payload["limits"]
    sink = CappedText(int(limits.get("max_print_chars", 10000)))
    sys.stdout = sys.stderr = sink
    sys.stdin = io.StringIO("")
    emit({"event": "ready", "isolation": isolation, "uid": os.getuid()})
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
    payload = json.loads(sys.stdin.buffer.read())
    if payload.get("isolation") == "namespaces":
        return run_namespaced(payload)
    return run_basic(payload)


if __name__ == "__main__":
    sys.exit(main())
