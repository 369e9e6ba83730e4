"""Run inside a NeMo Gym environment: the one process that starts that environment's servers.

Every NeMo Gym server imports nemo_gym's dependencies before it serves (pandas, scipy, openai,
fastapi, wandb, mlflow: ~3.5 of its ~4.4 s of import CPU on a 2-core machine, measured
2026-12-06), so a stack of several NeMo Gym servers spent most of its start importing the same
modules again in each. This process imports them once per environment and forks each server from
there. The child then becomes what ``python app.py`` in the folder would be: its own session, the
folder as working directory, the server's environment variables, the interpreter's path with the
folder and its ``PYTHONPATH`` in front, ``sys.argv`` and ``__main__`` of the entrypoint, and the
entrypoint's code run as ``__main__``, so an exception or ``sys.exit`` ends it as it ends a fresh
interpreter.

What is imported here is nemo_gym's *dependencies*, never nemo_gym itself: importing nemo_gym
has effects that belong to each server (paths from its working directory, the Hugging Face cache
variables, ``sys.path``, ``print``), so each server imports it (~0.9 s). Which modules those are
is learnt in a throwaway child that imports nemo_gym's base modules (``_dependencies``). What
still differs from a fresh interpreter: the hash seed is the fork server's, and ``ps`` shows the
fork server's command line. A folder module whose name a preloaded module already took would be
shadowed, so such a server is started as a fresh interpreter instead (``_shadowed``), as is every
server when the stack says ``nemo_gym_fork: false``, or when a dependency imported nemo_gym.

It also completes the stack's config with the installed nemo-gym's own parser (``resolve``): a
NeMo Gym server trusts ``NEMO_GYM_CONFIG_DICT`` to be what ``ng_run`` resolved, every default of
its version filled in, so polygym asks the installed nemo-gym rather than restate those defaults.
That runs in a forked child too, so nothing it imports or caches stays here.

Protocol, one JSON object per line: requests on stdin, replies and each server's exit
(``{"op": "exited", "pid", "returncode"}``, negative for a signal) on stdout; the first line says
whether it forks. When stdin closes (the stack stopped, or its launcher was killed) it ends every
server it started, so none outlives the stack. The file descriptors it was given (the
environment's lease) stay open in every server. It imports nothing from polygym, which is not
installed in that environment.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REFUSAL_MARK = "polygym: NeMo Gym refused the config: "
"""Kept equal to ``stack.nemo_gym_server.REFUSAL_MARK`` (this script cannot import polygym)."""
OWN_PACKAGE = "nemo_gym"
MAIN_NAMES = (OWN_PACKAGE, "__main__", "__mp_main__")
"""Modules the fork server never imports: nemo_gym's own, and whatever stands for ``__main__``."""
PRELOAD = (
    "nemo_gym.server_utils",
    "nemo_gym.base_resources_server",
    "nemo_gym.base_responses_api_agent",
    "nemo_gym.base_responses_api_model",
)
"""What every NeMo Gym server imports first (their dependencies are preloaded, not these); a module
this nemo-gym lacks is skipped."""
STOP_GRACE_S = 10.0
"""How long the servers get after SIGTERM, once the stack is gone, before SIGKILL."""

BASE_PATH = [p for p in sys.path if p != str(Path(__file__).resolve().parent)]
"""The interpreter's own path without this script's folder (polygym's ``stack`` package, whose
module names must not shadow anything a server imports)."""


class _Replies:
    """Where replies go: the stdout this process was given, moved off file descriptor 1 (which then
    writes to the log, as stderr does) so that nothing an import prints can corrupt a reply."""

    fd = 1

    @classmethod
    def take_stdout(cls) -> None:
        cls.fd = os.dup(1)
        os.dup2(2, 1)

    @classmethod
    def send(cls, message: dict[str, Any]) -> None:
        with contextlib.suppress(BrokenPipeError):  # the stack is gone; its servers are being ended
            os.write(cls.fd, json.dumps(message).encode() + b"\n")


def main() -> dict[str, Any] | None:
    """Serve requests until stdin closes; in a forked server, the request it must become."""
    _Replies.take_stdout()
    sys.path[:] = BASE_PATH
    forking = "--no-fork" not in sys.argv
    env_set = _preload(Path(sys.argv[sys.argv.index("--dependencies") + 1])) if forking else {}
    forking = forking and OWN_PACKAGE not in sys.modules
    _Replies.send({"op": "ready", "forking": forking})
    return _serve(forking, env_set)


def _fork() -> int:
    """``os.fork``, without the warning Python gives when native threads exist (OpenBLAS's and
    jemalloc's pools, which re-arm in the child): the child execs nothing and runs Python on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _preload(known: Path) -> dict[str, str]:
    """Import nemo_gym's dependencies; the environment variables their imports set, which a fresh
    interpreter's imports would set too."""
    before = dict(os.environ)
    for name in _dependencies(known):
        with contextlib.suppress(Exception):  # one that imports only in nemo_gym's order: its own
            importlib.import_module(name)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _dependencies(known: Path) -> list[str]:
    """The modules nemo_gym's base modules import, in import order, less nemo_gym's own. Learnt
    once per environment (its packages do not change once built) in a throwaway child, since
    importing nemo_gym here would give every server its import effects, and kept in ``known``."""
    with contextlib.suppress(OSError, ValueError):
        names = json.loads(known.read_text())
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            return names
    names = _dependencies_in_a_child()
    with contextlib.suppress(OSError):  # a read-only environment learns them again next time
        partial = known.with_name(f"{known.name}.{os.getpid()}")
        partial.write_text(json.dumps(names))
        partial.replace(known)
    return names


def _dependencies_in_a_child() -> list[str]:
    names = _answer_from_a_child(_imported_by_preload)
    return [str(name) for name in names] if isinstance(names, list) else []


def _imported_by_preload() -> list[str]:
    before = set(sys.modules)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return [m for m in sys.modules if m not in before and m.split(".")[0] not in MAIN_NAMES]


def _answer_from_a_child(work: Callable[[], Any]) -> Any:
    """``work()`` run in a forked child that exits at once after, its JSON answer read back (None
    when the child died first): what it imports or caches stays in the child."""
    result_read, result_write = os.pipe()
    pid = _fork()
    if pid == 0:
        try:
            os.close(result_read)
            with os.fdopen(result_write, "wb") as out:
                out.write(json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(result_write)
    with os.fdopen(result_read, "rb") as source:
        data = source.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else None


class _Servers:
    """The servers started so far, by pid; a fresh interpreter's ``Popen`` is kept so it is not
    reaped behind its back."""

    def __init__(self) -> None:
        self.live: dict[int, subprocess.Popen[bytes] | None] = {}

    def reap(self) -> None:
        for pid in list(self.live):
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    process = self.live.pop(pid)
                    if process is not None:
                        process.returncode = os.waitstatus_to_exitcode(status)
                    _Replies.send(
                        {"op": "exited", "pid": pid, "returncode": os.waitstatus_to_exitcode(status)}
                    )

    def end_all(self) -> None:
        """SIGTERM every server's group, SIGKILL what is left after the grace period."""
        for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            for pid in self.live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + grace
            while self.live and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.05)


def _serve(forking: bool, env_set: dict[str, str]) -> dict[str, Any] | None:
    servers = _Servers()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    pending = b""
    try:
        while True:
            for key, _ in selector.select():
                if key.fd == wake_read:
                    os.read(wake_read, 4096)
                    servers.reap()
                    continue
                chunk = os.read(0, 1 << 20)
                if not chunk:
                    servers.end_all()
                    return None
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    job = _handle(json.loads(line), forking, servers)
                    if job is not None:  # this is a forked server now
                        selector.close()
                        for fd in (wake_read, wake_write, _Replies.fd):
                            os.close(fd)
                        return {**job, "env": {**job["env"], **env_set}}
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _handle(request: dict[str, Any], forking: bool, servers: _Servers) -> dict[str, Any] | None:
    if request["op"] == "resolve":
        _Replies.send(_resolve_in_child(request["config"]))
        return None
    try:
        if forking and not _shadowed(request):
            pid = _fork()
            if pid == 0:
                os.setsid()  # before anything else: the stack signals the server's group by its pid
                return request
            servers.live[pid] = None
        else:
            process = _fresh_interpreter(request)
            servers.live[process.pid] = process
            pid = process.pid
    except OSError as exc:  # this server cannot start; the others, and the stack, go on to say so
        _Replies.send({"op": "failed", "name": request["name"], "error": f"{type(exc).__name__}: {exc}"})
        return None
    _Replies.send({"op": "spawned", "name": request["name"], "pid": pid})
    return None


def _own_folders(request: dict[str, Any]) -> list[str]:
    """The entrypoint's folder and the server's ``PYTHONPATH``: what ``python <entrypoint>`` puts
    before the interpreter's own path."""
    script_dir = os.path.dirname(os.path.realpath(_script(request)))
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    return [script_dir, *extra]


def _script(request: dict[str, Any]) -> str:
    """The entrypoint as a fresh interpreter's ``__main__.__file__`` names it (absolute, links kept)."""
    return os.path.abspath(os.path.join(request["cwd"], request["entrypoint"]))


def _search_path(request: dict[str, Any]) -> list[str]:
    own = _own_folders(request)
    return [*own, *(p for p in BASE_PATH if p not in own)]


def _shadowed(request: dict[str, Any]) -> bool:
    """Whether a module the server's own folders hold is already imported from elsewhere."""
    for folder in _own_folders(request):
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                loaded = sys.modules.get(entry.name.split(".")[0])  # a package, foo.py, foo.cpython-*.so
                origin = getattr(loaded, "__file__", None) or ""
                if loaded is not None and not (origin and Path(origin).is_relative_to(folder)):
                    return True
    return False


def _fresh_interpreter(request: dict[str, Any]) -> subprocess.Popen[bytes]:
    with open(request["log"], "ab") as log:
        return subprocess.Popen(
            [sys.executable, request["entrypoint"]],
            cwd=request["cwd"],
            env=request["env"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            pass_fds=(request["keep_fd"],),  # the environment's lease, as a forked server keeps it
        )


def _resolve_in_child(config: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's parser run in a forked child, whatever it prints captured (stdout is the protocol)."""
    with tempfile.TemporaryFile() as printed:

        def resolve_printing_there() -> dict[str, Any]:
            os.dup2(printed.fileno(), 1)
            os.dup2(printed.fileno(), 2)
            return _resolve(config)

        answer = _answer_from_a_child(resolve_printing_there) or {"refused": "the resolver died"}
        printed.seek(0)
        text = printed.read().decode(errors="replace")
    if "refused" in answer:
        return {"op": "refused", "stderr": f"{text}{REFUSAL_MARK}{answer['refused']}\n"}
    return {"op": "resolved", "yaml": answer["yaml"]}


def _resolve(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` through NeMo Gym's ``GlobalConfigDictParser`` (no command line, no env.yaml:
    polygym already merged those), as YAML; or NeMo Gym's reason for refusing it."""
    try:
        omegaconf = importlib.import_module("omegaconf")
        global_config = importlib.import_module("nemo_gym.global_config")
        parse_config = global_config.GlobalConfigDictParserConfig(
            initial_global_config_dict=omegaconf.OmegaConf.create(config),
            skip_load_from_cli=True,
            skip_load_from_dotenv=True,
        )
        resolved = global_config.GlobalConfigDictParser().parse(parse_config)
        return {"yaml": omegaconf.OmegaConf.to_yaml(resolved)}
    except Exception as exc:  # NeMo Gym's refusal: its reason, marked for the parent to show
        return {"refused": f"{type(exc).__name__}: {exc}"}


def become_server(request: dict[str, Any]) -> None:
    """In the forked child: turn into ``python <entrypoint>`` and run it as ``__main__``."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # as open() makes it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = _search_path(request)
    _reseed()
    script = _script(request)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=script,
        __builtins__=__builtins__,
        __loader__=importlib.machinery.SourceFileLoader("__main__", script),
        __package__=None,
        __spec__=None,
        __cached__=None,
    )
    sys.modules["__main__"] = module
    if "__mp_main__" in sys.modules:  # multiprocessing's alias of __main__, taken at its import
        sys.modules["__mp_main__"] = module
    sys.argv[:] = [request["entrypoint"]]
    code = compile(Path(script).read_bytes(), script, "exec", dont_inherit=True)
    exec(code, module.__dict__)


def _reseed() -> None:
    """A fresh interpreter seeds numpy's global generator from the OS; forked copies would share
    one sequence (``random`` reseeds itself after a fork)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


if __name__ == "__main__":
    job = main()
    if job is not None:
        become_server(job)
