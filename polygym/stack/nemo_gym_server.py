"""NeMo Gym's own servers in a polygym stack, started the way NeMo Gym's ``ng_run`` starts them.

A server folder whose entrypoint imports ``nemo_gym`` (or whose config says ``nemo_gym: true``)
is not imported into polygym: it runs as NeMo Gym runs it, so it behaves exactly as it does there.
The process contract, read from NeMo Gym's ``ng_run`` (``nemo_gym/cli/env.py``,
``cli/setup_command.py``, ``server_utils.py``):

* **Its own environment**: nemo-gym plus the folder's ``requirements.txt``, whose line naming
  NeMo Gym's checkout (``-e nemo-gym[dev] @ ../../``) is replaced by the nemo-gym package
  itself, as ``ng_run`` does outside a checkout, or its ``pyproject.toml``'s dependencies.
  Built and cached by ``stack.env_build``; the server runs as if that environment were
  activated (its ``bin`` first on ``PATH``: some servers call ``uv``).
* **The command**: that environment's interpreter running the entrypoint (``python app.py``), in
  the server folder, with the folder on ``PYTHONPATH`` (and a checkout's root, which NeMo Gym's
  editable install puts there). polygym's own ``PYTHONPATH`` is not passed on: it is for another
  interpreter, and its ``resources_servers`` package would shadow NeMo Gym's. The process is
  forked from the environment's fork server (``stack.nemo_gym_forkserver``), which imported
  nemo_gym's dependencies once, and becomes exactly that command there.
* **Its configuration**: the whole resolved global config as YAML in ``NEMO_GYM_CONFIG_DICT``
  and the server's own top-level name in ``NEMO_GYM_CONFIG_PATH``. The defaults NeMo Gym fills
  in come from the installed nemo-gym itself (the fork server asks it), so they are right for
  its version. Every server of the stack is in it with its ``host``/``port`` and the head server
  under ``head_server``: a NeMo Gym server's ``ServerClient`` resolves names from this config.
* **Its address**: NeMo Gym's parent chooses the port and the child binds it (the child reads it
  from the config). polygym otherwise binds, never probes (DESIGN §4), but this contract leaves
  no other way: a free port is chosen just before the child starts, as ``ng_run`` does, below
  the range outgoing connections draw from, and the child counts as listening only once it holds
  that port itself (``net.child_port``). The launcher registers the child in the head registry
  by that URL once it does, so polygym's servers and collectors reach it by name like any other.
* **Its Ray cluster**: a server that uses Ray joins the cluster at ``ray_head_node_address``, one
  that ``ng_run`` starts for all its servers; the stack starts one per environment likewise
  (``stack.nemo_gym_ray``).

polygym's servers start first (their addresses go into the children's config), then every NeMo
Gym server at once; a child that dies is reported by name with its log tail, as the subprocess
backend reports its own.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import signal
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from polygym.errors import ConfigError
from polygym.net.child_port import holds_listener, port_for_a_child
from polygym.stack import catalog
from polygym.stack import records as stacks
from polygym.stack.backend import (
    LOG_TAIL_LINES,
    LaunchError,
    RunningServer,
    ServerFailure,
    first_exit,
    how_it_ended,
    log_tail,
    stop_processes,
)
from polygym.stack.config import NEMO_GYM_SETTINGS as STACK_KEYS
from polygym.stack.config import StackConfig
from polygym.stack.env_build import (
    PACKAGE_KEY,
    PYTHON_KEY,
    EnvInputs,
    file_digest,
    find_python,
    lease_env,
)
from polygym.stack.env_cache import Lease
from polygym.stack.head import HEAD_SERVER_KEY, Registry
from polygym.stack.nemo_gym_forks import ConfigRefused, ForkedServer, ForkServer
from polygym.stack.nemo_gym_ray import LOOPBACK_ENV, RayCluster, ServerCode, grouped, ray_users
from polygym.stack.server_spec import ServerSpec

NEMO_GYM_KEY = catalog.NEMO_GYM_KEY
CONFIG_DICT_ENV = "NEMO_GYM_CONFIG_DICT"
CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
READY_TIMEOUT_S = 180.0
"""NeMo Gym servers import a lot (Ray, MLflow, openai) before they bind; cold caches make it slow."""
FORK_KEY = catalog.NEMO_GYM_FORK_KEY
REFUSAL_MARK = "polygym: NeMo Gym refused the config: "
"""What ``nemo_gym_forkserver`` prints before NeMo Gym's own reason (its exception), so that reason is
shown rather than the tail of whatever NeMo Gym logged before it (often the whole config)."""
REASON_LINES = 40
CONFIG_DUMP = "\nFound global config dict yaml:"
"""Where NeMo Gym 0.7.0 starts appending the whole config to an exception's message."""


def entrypoint_of(spec: ServerSpec) -> str:
    return str(spec.config.get("entrypoint") or "app.py")


def is_nemo_gym_server(spec: ServerSpec) -> bool:
    """A NeMo Gym server: marked ``nemo_gym: true``, or a NeMo Gym folder (``catalog.is_nemo_gym_folder``)."""
    return spec.config.get(NEMO_GYM_KEY) is True or catalog.is_nemo_gym_folder(
        spec.directory, entrypoint_of(spec)
    )


_DEFINITIONS: tuple[type[ast.stmt], ...] = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef)
_DEFINITIONS += (ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Pass)


def _only_defines(statement: ast.stmt) -> bool:
    """Whether a top-level statement only defines something (a docstring and ``if TYPE_CHECKING:``
    included): it cannot start a server."""
    if isinstance(statement, _DEFINITIONS):
        return True
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    test = statement.test if isinstance(statement, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def nothing_to_run(spec: ServerSpec) -> str | None:
    """Why NeMo Gym's folder of ``spec`` has no server to start, or None when it may have one. A
    library folder (``sec_local_index``, ``gymnasium``) declares an entrypoint only because every
    folder does, and ``python`` on a file that only defines things exits at once. Anything else at
    its top level (a ``__main__`` guard in any spelling, a call) may start a server: it is run."""
    entrypoint = spec.directory / entrypoint_of(spec)
    try:
        tree = ast.parse(entrypoint.read_bytes(), str(entrypoint))
    except OSError:
        return f"its entrypoint {entrypoint} cannot be read"
    except (SyntaxError, ValueError):
        return None  # NeMo Gym's own run says what is wrong with it
    if not all(_only_defines(statement) for statement in tree.body):
        return None
    said = spec.config.get("description")
    return (
        f"its entrypoint {entrypoint_of(spec)} starts nothing (it only defines classes, functions "
        "and values): a library other servers import, not a server"
        + (f" (its config says: {said})" if isinstance(said, str) and said else "")
    )


@dataclass(frozen=True)
class NemoGymPackage:
    """What pip installs as nemo-gym for servers of one NeMo Gym root."""

    install: str
    digest: str
    requires_python: str | None


def _dist_info(root: Path) -> Path | None:
    found = sorted(root.glob("nemo_gym-*.dist-info"))
    return found[-1] if found else None


def _metadata_field(text: str, field: str) -> str | None:
    match = re.search(rf"^{field}:\s*(.+)$", text, re.MULTILINE)
    return match[1].strip() if match else None


def nemo_gym_package(root: Path, override: str | None) -> NemoGymPackage:
    """nemo-gym for servers found under ``root``: a NeMo Gym checkout (its ``pyproject.toml``), an
    installed or unpacked wheel (its ``dist-info``: the wheel next to it if there is one, else
    ``nemo-gym==VERSION`` from the package index), or ``override`` (config ``nemo_gym_package``)."""
    info = _dist_info(root)
    requires = None
    if info is not None and (info / "METADATA").is_file():
        text = (info / "METADATA").read_text(errors="replace")
        requires = _metadata_field(text, "Requires-Python")
        version = _metadata_field(text, "Version")
    if override:
        path = Path(override).expanduser()
        digest = file_digest(path) if path.is_file() else override
        return NemoGymPackage(str(path) if path.is_file() else override, digest, requires)
    if info is not None and version:
        for folder in (root, root.parent):
            wheels = sorted(folder.glob(f"nemo_gym-{version}-*.whl"))
            if wheels:
                return NemoGymPackage(str(wheels[-1]), file_digest(wheels[-1]), requires)
        return NemoGymPackage(f"nemo-gym=={version}", f"nemo-gym=={version}", requires)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text(errors="replace")
        match = re.search(r'requires-python\s*=\s*"([^"]+)"', text)
        return NemoGymPackage(str(root), file_digest(pyproject), match[1] if match else None)
    raise ConfigError(
        [
            f"{root}: cannot tell which nemo-gym its servers need (no nemo_gym-*.dist-info, no "
            f"pyproject.toml); set {PACKAGE_KEY}: nemo-gym==VERSION (or a wheel path) in the config"
        ]
    )


def server_requirements(spec: ServerSpec) -> tuple[str, ...]:
    """The folder's requirements without nemo-gym itself (installed from its root's package):
    ``requirements.txt`` less the line naming NeMo Gym's checkout, or ``pyproject.toml``'s
    ``[project] dependencies`` less ``nemo-gym`` (NeMo Gym installs those with ``--no-sources``
    outside a checkout: every other dependency from the package index). Both: refused, as NeMo
    Gym refuses them."""
    text_file, project = spec.directory / "requirements.txt", spec.directory / "pyproject.toml"
    if text_file.is_file() and project.is_file():
        raise ConfigError(
            [
                f"{spec.name}: {spec.directory} has both requirements.txt and pyproject.toml; "
                "NeMo Gym takes one or the other"
            ]
        )
    if project.is_file():
        return _project_dependencies(spec, project)
    if not text_file.is_file():
        return ()
    return tuple(line for line in _listed(text_file) if "../.." not in line)


def server_overrides(spec: ServerSpec) -> tuple[str, ...]:
    """The folder's ``overrides.txt`` lines, which ``ng_run`` passes to uv's ``--override`` with a
    ``requirements.txt`` (never with a ``pyproject.toml``): versions forced over what the folder's
    packages declare (``toolsandbox``: ``pycountry``; ``osworld_agent``: ``torch==2.11.0``)."""
    listed, requirements = spec.directory / "overrides.txt", spec.directory / "requirements.txt"
    if not (listed.is_file() and requirements.is_file()):
        return ()
    return _listed(listed)


def _listed(path: Path) -> tuple[str, ...]:
    """A pip requirements-style file's entries: its lines less blanks and comments."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def _project_dependencies(spec: ServerSpec, project: Path) -> tuple[str, ...]:
    try:
        listed = tomllib.loads(project.read_text()).get("project", {}).get("dependencies", [])
        kept = [text for text in listed if canonicalize_name(Requirement(text).name) != "nemo-gym"]
    except (tomllib.TOMLDecodeError, InvalidRequirement, AttributeError, TypeError) as exc:
        raise ConfigError([f"{spec.name}: {project}: cannot read its [project] dependencies: {exc}"]) from exc
    return tuple(kept)


def server_code(spec: ServerSpec) -> ServerCode:
    """Where the server's code is, for reading whether it uses Ray (``stack.nemo_gym_ray``)."""
    return ServerCode(spec.directory / entrypoint_of(spec), (spec.directory, _root_of(spec)))


def _root_of(spec: ServerSpec) -> Path:
    """The tree the server's folder is in (a nested ``<kind>/<folder>/<variant>`` one's too)."""
    return catalog.tree_root(spec.directory) or spec.directory.resolve().parent.parent


def env_inputs(spec: ServerSpec, config: StackConfig) -> EnvInputs:
    """What the environment of ``spec`` is made of (config keys first, then the defaults)."""
    root = _root_of(spec)
    package = nemo_gym_package(root, _text(config.globals.get(PACKAGE_KEY)))
    python = find_python(_text(config.globals.get(PYTHON_KEY)), package.requires_python)
    return EnvInputs(
        python=str(python.path),
        python_version=python.version_text,
        ignore_requires_python=python.ignore_requires_python,
        nemo_gym=package.install,
        nemo_gym_digest=package.digest,
        requirements=server_requirements(spec),
        overrides=server_overrides(spec),
    )


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def global_config(
    config: StackConfig, addresses: dict[str, tuple[str, int]], head_url: str
) -> dict[str, Any]:
    """The stack as NeMo Gym's global config: every server with its address, and the head's."""
    out: dict[str, Any] = {k: v for k, v in config.globals.items() if k not in STACK_KEYS}
    for spec in config.servers.values():
        inner = {k: v for k, v in spec.config.items() if k != NEMO_GYM_KEY}
        inner.setdefault("entrypoint", "app.py")
        host, port = addresses[spec.name]
        inner.update(host=host, port=port)
        out[spec.name] = {spec.kind: {spec.implementation: inner}}
    head = urlsplit(head_url)
    out[HEAD_SERVER_KEY] = {"host": head.hostname, "port": head.port}
    return out


def refusal_text(stderr: str) -> str:
    """NeMo Gym's reason for refusing a config: what it printed before raising (its warnings, such
    as each almost-server's validation errors) and its exception, without the whole config it
    appends to some exceptions; the log's tail when the resolver itself failed."""
    if REFUSAL_MARK not in stderr:
        lines = stderr.strip().splitlines()[-LOG_TAIL_LINES:]
    else:
        before, reason = stderr.split(REFUSAL_MARK, 1)
        reason = reason.split(CONFIG_DUMP, 1)[0]
        lines = [*before.strip().splitlines()[-REASON_LINES:], *reason.strip().splitlines()[:REASON_LINES]]
    return "\n".join(f"    {line}" for line in lines)


class NemoGymServers:
    """The NeMo Gym servers of one stack: environments, processes, registry entries."""

    def __init__(self, specs: list[ServerSpec]) -> None:
        """Raises ``ConfigError`` (exit 2) naming every folder with no server to start."""
        idle = [(spec, why) for spec in specs if (why := nothing_to_run(spec)) is not None]
        if idle:
            raise ConfigError(
                [
                    f"{spec.name}: NeMo Gym's folder {spec.directory} has no server to run: {why}"
                    for spec, why in idle
                ]
            )
        self.specs = specs
        self.procs: dict[str, ForkedServer] = {}
        self.logs: dict[str, Path] = {}
        self.forks: dict[Path, ForkServer] = {}
        self.leases: list[Lease] = []
        """The environments the servers run in, held until stop() (and by the fork servers and
        each server, which inherit its lease) so that no prune removes them."""
        self.clusters: dict[Path, RayCluster] = {}
        """The Ray cluster of each environment that has servers using Ray (``nemo_gym_ray``)."""

    async def start(self, config: StackConfig, registry: Registry, head_url: str, stack_id: str) -> None:
        """Build (or reuse) each environment, start every server, register each once it listens."""
        inputs = {spec.name: env_inputs(spec, config) for spec in self.specs}
        distinct = list(dict.fromkeys(inputs.values()))  # servers with the same inputs share one
        for each in {(i.python, i.python_version) for i in distinct if i.ignore_requires_python}:
            print(
                f"warning: nemo-gym declares a newer Python than {each[1]} ({each[0]}); installing it "
                "there anyway (uv's --python-version at nemo-gym's floor, else pip's "
                f"--ignore-requires-python; choose another: --nemo-gym-python, {PYTHON_KEY})",
                file=sys.stderr,
            )
        leased = await asyncio.gather(
            *(asyncio.to_thread(lease_env, each) for each in distinct), return_exceptions=True
        )
        held = {each: lease for each, lease in zip(distinct, leased, strict=True) if isinstance(lease, Lease)}
        self.leases.extend(held.values())  # stop() lets go of them, even when another build failed
        failed = next((error for error in leased if isinstance(error, BaseException)), None)
        if failed is not None:
            raise failed
        envs = {name: held[each] for name, each in inputs.items()}
        users = ray_users({spec.name: server_code(spec) for spec in self.specs}, config.globals)
        ray_envs = grouped(users, {name: lease.path for name, lease in envs.items()})
        log_dir = stacks.logs_dir(stack_id)
        await _all_started(  # a Ray cluster starts while the fork servers import
            [
                self._start_fork_servers(envs, log_dir, _fork_setting(config), set(ray_envs)),
                self._start_clusters(envs, ray_envs, log_dir),
            ],
            lambda _: None,
        )
        addresses = {name: _address(entry["url"]) for name, entry in registry.entries.items()}
        for spec in self.specs:
            addresses[spec.name] = ("127.0.0.1", port_for_a_child("127.0.0.1"))
        missing = [name for name in config.servers if name not in addresses]
        if missing:
            raise LaunchError(f"no address for {', '.join(missing)} to give NeMo Gym's servers")
        whole = global_config(config, addresses, head_url)
        forks = list(self.forks.values())
        texts = await asyncio.gather(
            *(_resolve(fork, self._joining(whole, fork.env)) for fork in forks), return_exceptions=True
        )
        refused = next((text for text in texts if isinstance(text, BaseException)), None)
        if refused is not None:
            raise refused
        resolved = {fork.env: str(text) for fork, text in zip(forks, texts, strict=True)}
        for spec in self.specs:
            env = envs[spec.name].path
            await self._spawn(spec, self.forks[env], resolved[env], log_dir)
        await self._wait_listening(registry, addresses)

    async def _start_fork_servers(
        self, envs: dict[str, Lease], log_dir: Path, fork: bool, ray_envs: set[Path]
    ) -> None:
        """One fork server per environment, started together. It holds the environment's lease, and
        so does every server it starts. It forks only where it starts more than one server: its
        preload costs about what one server's imports cost."""
        firsts = {lease: next(s for s in self.specs if envs[s.name] is lease) for lease in envs.values()}
        counts = Counter(lease.path for lease in envs.values())

        def keep(server: ForkServer) -> None:
            self.forks[server.env] = server

        await _all_started(
            (
                ForkServer.start(
                    lease.path,
                    log_dir / f"nemo_gym_forkserver.{lease.path.name}.log",
                    {
                        **_activated(lease.path, _checkout(spec)),
                        **(LOOPBACK_ENV if lease.path in ray_envs else {}),
                    },
                    fork and counts[lease.path] > 1,
                    lease.fileno(),
                )
                for lease, spec in firsts.items()
            ),
            keep,
        )

    async def _start_clusters(
        self, envs: dict[str, Lease], users: dict[Path, list[str]], log_dir: Path
    ) -> None:
        """One Ray cluster per environment with servers that use Ray, started together."""
        leases = {lease.path: lease for lease in envs.values()}

        def keep(cluster: RayCluster) -> None:
            self.clusters[cluster.env] = cluster

        await _all_started(
            (
                RayCluster.start(
                    env, names, _activated(env, []), log_dir / f"ray.{env.name}.log", leases[env].fileno()
                )
                for env, names in users.items()
            ),
            keep,
        )

    def _joining(self, config: dict[str, Any], env: Path) -> dict[str, Any]:
        """``config`` for the servers of ``env``: with its Ray cluster's address where it has one."""
        cluster = self.clusters.get(env)
        return {**config, catalog.RAY_HEAD_NODE_KEY: cluster.address} if cluster is not None else config

    def ray_lines(self) -> list[str]:
        """What each Ray cluster started for the servers is, one line each."""
        return [cluster.describe() for cluster in self.clusters.values()]

    async def _spawn(self, spec: ServerSpec, fork: ForkServer, config_yaml: str, log_dir: Path) -> None:
        log_path = log_dir / f"{spec.name}.log"
        self.logs[spec.name] = log_path
        folder = str(spec.directory.resolve())
        child_env = {
            **_activated(fork.env, [folder, *_checkout(spec)]),
            **(self.clusters[fork.env].joining_env if fork.env in self.clusters else {}),
            CONFIG_DICT_ENV: config_yaml,
            CONFIG_PATH_ENV: spec.name,
        }
        self.procs[spec.name] = await fork.spawn(spec.name, entrypoint_of(spec), folder, child_env, log_path)

    async def _wait_listening(self, registry: Registry, addresses: dict[str, tuple[str, int]]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = {spec.name: spec for spec in self.specs}
        while waiting:
            for name, spec in list(waiting.items()):
                proc = self.procs[name]
                if proc.returncode is not None:
                    raise LaunchError(self.describe_death(name, proc.returncode, "while starting"))
                host, port = addresses[name]
                # the child's own listening socket: the kernel queues connections from then on
                if await asyncio.to_thread(holds_listener, proc.pid, port):
                    url = f"http://{host}:{port}"
                    entry = RunningServer(name, spec.kind, spec.implementation, url, proc.pid)
                    registry.register({**asdict(entry), "nemo_gym": True})
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                # what each was doing: a server waiting on a service or a download says so in its log
                tails = "\n".join(log_tail(self.logs.get(name)) for name in sorted(waiting))
                late = ", ".join(sorted(waiting))
                raise LaunchError(
                    f"NeMo Gym server(s) not listening after {READY_TIMEOUT_S:g}s: {late}\n{tails}"
                )
            if waiting:
                await asyncio.sleep(0.1)

    def describe_death(self, name: str, returncode: int, when: str = "") -> str:
        pid = self.procs[name].pid
        when = f" {when}" if when else ""
        return (
            f"NeMo Gym server '{name}' (pid {pid}) {how_it_ended(returncode)}{when}.\n"
            f"{log_tail(self.logs.get(name))}"
        )

    async def wait_failure(self) -> ServerFailure:
        name = await first_exit(self.procs)
        return ServerFailure(name, self.describe_death(name, self.procs[name].returncode or 0))

    async def stop(self) -> None:
        """SIGTERM each server's process group, SIGKILL what is left after the deadline; then the
        fork servers (which would end any server still running) and the Ray clusters; then let go
        of the environments."""
        try:
            await stop_processes(list(self.procs.values()), _signal_group)
            await asyncio.gather(
                *(fork.close() for fork in self.forks.values()),
                *(cluster.close() for cluster in self.clusters.values()),
            )
        finally:
            for lease in self.leases:
                lease.close()
            self.leases.clear()

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}


def _checkout(spec: ServerSpec) -> list[str]:
    """NeMo Gym's checkout root where the folder is in one: its editable install puts it on the path."""
    root = _root_of(spec)
    return [str(root)] if (root / "pyproject.toml").is_file() else []


def _activated(env: Path, python_path: list[str]) -> dict[str, str]:
    """This process's environment as ``env`` activated, ``PYTHONPATH`` being ``python_path`` only
    (polygym's is for another interpreter) and no server's own config."""
    inherited = {
        k: v for k, v in os.environ.items() if k not in (CONFIG_DICT_ENV, CONFIG_PATH_ENV, "PYTHONPATH")
    }
    return {
        **inherited,
        **({"PYTHONPATH": os.pathsep.join(python_path)} if python_path else {}),
        "PYTHONUNBUFFERED": "1",
        # as if activated, as ng_run runs it: its uv and console scripts come first on PATH
        "VIRTUAL_ENV": str(env),
        "PATH": os.pathsep.join([str(env / "bin"), os.environ.get("PATH", os.defpath)]),
    }


T = TypeVar("T")


async def _all_started(starting: Iterable[Awaitable[T]], keep: Callable[[T], None]) -> None:
    """Start them together; ``keep`` each that started (so a stop ends it), then raise the first
    failure: none is left starting behind the error."""
    started = await asyncio.gather(*starting, return_exceptions=True)
    for each in started:
        if not isinstance(each, BaseException):
            keep(each)
    failed = [each for each in started if isinstance(each, BaseException)]
    if failed:
        raise failed[0]


def _fork_setting(config: StackConfig) -> bool:
    value = config.globals.get(FORK_KEY, True)
    if not isinstance(value, bool):
        raise ConfigError(f"{FORK_KEY}: expected true or false, got {value!r}")
    return value


async def _resolve(fork: ForkServer, config: dict[str, Any]) -> str:
    try:
        return await fork.resolve(config)
    except ConfigRefused as refused:
        raise LaunchError(
            f"NeMo Gym (in {fork.env}) refused the stack's config:\n{refusal_text(str(refused))}"
        ) from None


def _signal_group(proc: ForkedServer, sig: signal.Signals) -> None:
    """Signal the process group the child leads (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return str(parts.hostname), int(parts.port or 80)
