"""Ray for NeMo Gym's servers in a polygym stack: which of them use it, and the one cluster they join.

A NeMo Gym server whose class says ``ray_enabled = True``, or says nothing (NeMo Gym then warns
and counts it as True: ``nemo_gym/server_utils.py``'s ``_server_uses_ray``), calls ``ray.init``
before it serves, at the ``ray_head_node_address`` of the global config it is given. NeMo Gym's
``ng_run`` starts one cluster in its own process and puts its address there, so all its servers
join that one. Without an address each such server starts a cluster of its own, or joins the
latest one Ray finds recorded on the machine (another stack's, or a stale record left by a crash,
which it then waits on until the stack's start times out). So polygym does what ``ng_run`` does:
one local cluster per NeMo Gym environment that has a server using Ray, started by a child in
that environment (``nemo_gym_ray_head``: the Ray version the servers import), its address given
to every server of that environment. The child ends the cluster when its stdin closes, so the
cluster stops with the stack, and does not outlive a launcher that was killed. A
``ray_head_node_address`` the user set is honoured: no cluster is started.

Which servers use Ray is read from their folder's code, never by importing it (polygym's process
has no nemo_gym): the class the entrypoint serves (``X.run_webserver()``), its ``ray_enabled``, or
the first its bases declare, following imports into the NeMo Gym tree and the server's folder;
NeMo Gym's own base classes declare none.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from polygym.stack.backend import LaunchError, log_tail
from polygym.stack.catalog import RAY_HEAD_NODE_KEY
from polygym.stack.env_build import venv_python

HEAD_SCRIPT = Path(__file__).with_name("nemo_gym_ray_head.py")
FLAG = "ray_enabled"
RUN_METHOD = "run_webserver"
NEMO_GYM_PACKAGE = "nemo_gym"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray's switch that keeps 127.0.0.1 as it is (``ray_backend._loopback_kept``): without it, in the
cluster's processes and in every server that joins, Ray replaces it by the machine's network
address, so the cluster would listen on the network and a joining server would dial elsewhere."""
FOLDER_PREFIX = "/tmp/pgray-"
"""Where each cluster keeps its sockets and logs: short (Ray's socket paths are bounded to ~107
characters) and its own (never ``/tmp/ray``, which other clusters and stale records share)."""
START_TIMEOUT_S = 120.0
"""Ray starts a head in seconds; a cold disk cache makes its first import slow."""
STOP_TIMEOUT_S = 30.0
"""How long the cluster gets to shut down once asked, before its process group is killed."""
IMPORT_DEPTH = 8
"""How many modules deep a server class's bases are followed."""
_UNDECLARED = object()  # a class body without ray_enabled, distinct from one that sets it to None


@dataclass(frozen=True)
class ServerCode:
    """Where a NeMo Gym server's code is: its entrypoint, and the folders its absolute imports
    resolve in (its own folder, its NeMo Gym tree)."""

    entrypoint: Path
    search: tuple[Path, ...]


def declared_ray_enabled(code: ServerCode) -> bool | None:
    """The ``ray_enabled`` the served class declares or inherits from a class of the NeMo Gym tree
    or the folder; None when nothing does, or when the served class cannot be told (the code does
    not parse, no ``X.run_webserver()``): NeMo Gym then uses Ray, so a cluster is there for it."""
    tree = _parse(code.entrypoint)
    if tree is None:
        return None
    found = [_class_flag(name, code.entrypoint, tree, code.search, IMPORT_DEPTH) for name in _served(tree)]
    if not found or None in found:
        return None
    return any(found)


def uses_ray(code: ServerCode) -> bool:
    """Whether the server calls ``ray.init`` as it starts (NeMo Gym's rule: unless declared False)."""
    return declared_ray_enabled(code) is not False


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _served(tree: ast.Module) -> list[str]:
    """The classes the module serves: every ``Name.run_webserver(...)`` it calls."""
    return list(
        dict.fromkeys(
            node.func.value.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == RUN_METHOD
            and isinstance(node.func.value, ast.Name)
        )
    )


def _class_flag(name: str, path: Path, tree: ast.Module, search: tuple[Path, ...], depth: int) -> bool | None:
    """``name``'s ``ray_enabled`` in the module ``path``: declared in its class body, else its first
    base's that declares a bool; a class imported from elsewhere is followed there."""
    if depth <= 0:
        return None
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef) and statement.name == name:
            declared = _declared(statement)
            if declared is not _UNDECLARED:
                return declared if isinstance(declared, bool) else None
            for base in statement.bases:
                inherited = _base_flag(base, path, tree, search, depth)
                if inherited is not None:
                    return inherited
            return None
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    return _imported_flag(statement, alias.name, path, search, depth - 1)
    return None


def _declared(cls: ast.ClassDef) -> object:
    """The class body's ``ray_enabled`` value (a constant; None for anything else), or _UNDECLARED."""
    for statement in cls.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == FLAG for target in targets):
            return value.value if isinstance(value, ast.Constant) else None
    return _UNDECLARED


def _base_flag(
    base: ast.expr, path: Path, tree: ast.Module, search: tuple[Path, ...], depth: int
) -> bool | None:
    """A base ``Name`` (or ``Name[...]``, a generic) resolved in the module; others are not followed."""
    if isinstance(base, ast.Subscript):
        base = base.value
    if not isinstance(base, ast.Name):
        return None
    return _class_flag(base.id, path, tree, search, depth)


def _imported_flag(
    statement: ast.ImportFrom, name: str, path: Path, search: tuple[Path, ...], depth: int
) -> bool | None:
    """``name`` from the module ``statement`` imports: NeMo Gym's package declares nothing (its base
    classes leave ``ray_enabled`` None); a module of the tree or the folder is read in turn."""
    module = statement.module or ""
    if statement.level == 0 and module.split(".")[0] == NEMO_GYM_PACKAGE:
        return None
    source = _module_file(module, statement.level, path, search)
    tree = _parse(source) if source is not None else None
    return None if tree is None or source is None else _class_flag(name, source, tree, search, depth)


def _module_file(module: str, level: int, path: Path, search: tuple[Path, ...]) -> Path | None:
    """The file of ``module`` (relative to ``path`` at ``level``, else in ``search``), or None."""
    if level > len(path.parents):
        return None
    bases = [path.parents[level - 1]] if level > 0 else list(search)
    parts = [part for part in module.split(".") if part]
    for base in bases:
        where = base.joinpath(*parts)
        for candidate in (where.with_suffix(".py"), where / "__init__.py"):
            if parts and candidate.is_file():
                return candidate
    return None


def ray_users(codes: dict[str, ServerCode], globals_: dict[str, object]) -> list[str]:
    """The servers polygym starts a cluster for: those that use Ray, unless the config names a
    cluster itself (``ray_head_node_address``, honoured as NeMo Gym honours it: any value set)."""
    if globals_.get(RAY_HEAD_NODE_KEY):
        return []
    return [name for name, code in codes.items() if uses_ray(code)]


class RayCluster:
    """One local Ray cluster for the NeMo Gym servers of one environment, owned by a child
    (``nemo_gym_ray_head``) in that environment."""

    def __init__(
        self, process: asyncio.subprocess.Process, env: Path, folder: Path, servers: list[str]
    ) -> None:
        self.process = process
        self.env = env
        self.folder = folder
        self.servers = servers
        self.address = ""
        self.joining_env: dict[str, str] = {}
        """What a server joining it needs in its environment: Ray's loopback switch, and the
        ``RAY_*`` variables Ray's start set in the owner (its authentication mode)."""

    @classmethod
    async def start(
        cls, env: Path, servers: list[str], child_env: dict[str, str], log: Path, keep_fd: int
    ) -> RayCluster:
        """Start it for ``servers`` (their names, for the error) and wait for its address.
        ``keep_fd`` (the environment's lease) stays open in the owner while the cluster runs."""
        folder = Path(tempfile.mkdtemp(prefix=Path(FOLDER_PREFIX).name, dir=Path(FOLDER_PREFIX).parent))
        try:
            with log.open("ab") as sink:
                process = await asyncio.create_subprocess_exec(
                    str(venv_python(env)),
                    str(HEAD_SCRIPT),
                    str(folder),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=sink,
                    env={**child_env, **LOOPBACK_ENV},
                    start_new_session=True,
                    pass_fds=(keep_fd,),
                )
        except OSError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise LaunchError(_not_started(servers, env, str(exc), log)) from None
        cluster = cls(process, env, folder, servers)
        reason = await cluster._read_address()
        if reason:
            await cluster.close()
            raise LaunchError(_not_started(servers, env, reason, log))
        return cluster

    async def _read_address(self) -> str:
        """Read the owner's answer into ``address``; why there is none, or ''."""
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            return f"no address after {START_TIMEOUT_S:g}s"
        try:
            reply = json.loads(line) if line else {}
        except ValueError:
            return f"it answered {line[:200]!r}"
        if not isinstance(reply, dict) or not isinstance(reply.get("address"), str):
            said = reply.get("error") if isinstance(reply, dict) else reply
            return str(said or "it exited without an address")
        self.address = reply["address"]
        said = reply.get("env")
        self.joining_env = {**LOOPBACK_ENV, **(said if isinstance(said, dict) else {})}
        return ""

    async def close(self) -> None:
        """Close the owner's stdin (it shuts the cluster down: ~2 s), wait; then kill what is left
        of its process group (all of the cluster's processes are in it: Ray's agents outlive an
        owner that was killed), and remove the cluster's folder."""
        with contextlib.suppress(OSError, RuntimeError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def describe(self) -> str:
        """The line ``gym env start`` prints for it."""
        names = ", ".join(self.servers)
        return f"Ray cluster {self.address} started for NeMo Gym's {names} ({FLAG} true or undeclared)"


def _not_started(servers: list[str], env: Path, reason: str, log: Path) -> str:
    return (
        f"could not start the Ray cluster that NeMo Gym server(s) {', '.join(servers)} use "
        f"({FLAG} true or undeclared) in {env}: {reason}\n{log_tail(log)}"
    )


def grouped(users: Iterable[str], env_of: dict[str, Path]) -> dict[Path, list[str]]:
    """The Ray users of each environment, in the order given: one cluster each."""
    out: dict[Path, list[str]] = {}
    for name in users:
        out.setdefault(env_of[name], []).append(name)
    return out
