"""Placing servers: the launcher brings a stack up, watches it, and takes it down.

A stack is the head server plus every server of a config. Backends decide *where* servers run;
the rest of polygym only knows names. Two backends exist:

* ``inline``: every server in this process and event loop, each on its own socket, and calls
  between them bypass the socket. Fastest to start and cheapest per call; one core.
* ``subprocess``: one OS process per server, for isolation and more cores. A server that dies is
  reported by name with the tail of its log, and the rest of the stack is stopped.

Every stack has a secret (``secrets.token_urlsafe``) made when it is built; its head server admits
HTTP registrations only with it (see ``head``). The subprocess backend hands it to each child in
the stdin payload — never argv or the environment of a ``ps`` listing — and the inline backend
registers its servers in process, so the secret never leaves the launcher there.

Connection pools follow the stack's concurrency: the pool size given to ``Stack`` (the collector's
``--concurrency`` when ``gym eval run`` starts the stack, ``gym env start --concurrency``) is the
pool of every client the stack's servers use to reach each other; with none given it is unlimited
(``stack_client``), never a fixed number that would cap a collector below its concurrency.

``--workers N`` runs the inline stack N times, one process each (``WorkersBackend``), for every
core of one machine without Ray; with ``--backend ray``, N Ray actors each hold such a copy.

A backend implements ``start`` / ``wait_failure`` / ``stop`` (``stack.backend.Backend``); the third one,
``ray`` (``stack.ray_backend``, imported only when chosen), places replicas of each server as Ray
actors. Servers never learn how they were placed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import psutil

from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, PortInUseError, bind_socket
from polygym.net.replicas import slot_of
from polygym.stack import records as stacks
from polygym.stack.backend import (
    START_TIMEOUT_S,
    Backend,
    LaunchError,
    RunningServer,
    ServerFailure,
    first_exit,
    how_it_ended,
    log_tail,
    spec_to_dict,
    stack_client,
    stop_processes,
)
from polygym.stack.config import ConfigError, StackConfig
from polygym.stack.external import EXTERNAL, external_entries
from polygym.stack.head import Registry, head_app
from polygym.stack.loader import serve_in_process
from polygym.stack.nemo_gym_server import NemoGymServers, is_nemo_gym_server
from polygym.stack.placement import BACKENDS, copy_placement, placement_of
from polygym.stack.server_spec import ServerSpec

DEFAULT_HEAD_PORT = 11000
SECRET_BYTES = 32


class InlineBackend:
    """All servers in this process; a shared client routes calls between them in-process."""

    name = "inline"

    def __init__(self, pool_size: int | None = None) -> None:
        self.client: ServerClient | None = None
        self.pool_size = pool_size
        self._servers: list[tuple[str, AppServer]] = []

    async def start(
        self, specs: list[ServerSpec], registry: Registry, head_url: str, stack_id: str, secret: str
    ) -> None:
        """Registers every server in process (``registered_by: launcher``): no secret is needed."""
        self.client = stack_client(head_url, self.pool_size)
        for spec, app_server in await serve_in_process(specs, self.client, "127.0.0.1"):
            self._servers.append((spec.name, app_server))
            entry = RunningServer(
                spec.name, spec.kind, spec.implementation, app_server.url, os.getpid(), self.pool_size
            )
            registry.register(asdict(entry))
            self.client.set_address(spec.name, app_server.url)

    async def wait_failure(self) -> ServerFailure:
        tasks = {asyncio.ensure_future(s.task): name for name, s in self._servers if s.task is not None}
        if not tasks:
            await asyncio.Event().wait()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        task = next(iter(done))
        error = task.exception() if not task.cancelled() else None
        return ServerFailure(tasks[task], f"stopped serving: {error!r}" if error else "stopped serving")

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for _, s in self._servers), return_exceptions=True)
        self._servers.clear()
        if self.client is not None:
            await self.client.close()


class SubprocessBackend:
    """One ``python -m polygym.stack.serve`` process per server; the full config goes over stdin."""

    name = "subprocess"

    def __init__(self, pool_size: int | None = None) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.logs: dict[str, Path] = {}
        self.pool_size = pool_size
        self._secret = ""

    async def start(
        self, specs: list[ServerSpec], registry: Registry, head_url: str, stack_id: str, secret: str
    ) -> None:
        """Each child registers itself over HTTP with ``secret``, which it reads from stdin."""
        self._secret = secret
        log_dir = stacks.logs_dir(stack_id)
        for spec in specs:
            await self._spawn(spec.name, [spec], head_url, log_dir / f"{spec.name}.log")
        await self._wait_registered({spec.name: spec.name for spec in specs}, registry)

    async def restart(self, spec: ServerSpec, registry: Registry, head_url: str, stack_id: str) -> None:
        """Start a fresh process for a server that died; callers re-resolve its new address."""
        old = self.procs.get(spec.name)
        if old is not None and old.returncode is None:
            raise LaunchError(f"server '{spec.name}' is still running (pid {old.pid})")
        registry.remove(spec.name)
        await self._spawn(spec.name, [spec], head_url, stacks.logs_dir(stack_id) / f"{spec.name}.log")
        await self._wait_registered({spec.name: spec.name}, registry)

    async def _spawn(
        self, key: str, specs: list[ServerSpec], head_url: str, log_path: Path, replica: int | None = None
    ) -> None:
        """Start process ``key`` serving ``specs`` (registered as ``replica`` when given)."""
        self.logs[key] = log_path
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "polygym.stack.serve",
                stdin=asyncio.subprocess.PIPE,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        payload = {
            "specs": [spec_to_dict(spec) for spec in specs],
            "replica": replica,
            "head_url": head_url,
            "parent_pid": os.getpid(),
            "stack_secret": self._secret,
            "pool_size": self.pool_size,
        }
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps(payload))
        proc.stdin.close()
        self.procs[key] = proc

    async def _wait_registered(self, slots: dict[str, str], registry: Registry) -> None:
        """Wait until every registry slot of ``slots`` (slot -> the process serving it) is held."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting := slots.keys() - registry.entries.keys():
            for key in sorted({slots[slot] for slot in waiting}):
                proc = self.procs[key]
                if proc.returncode is not None:
                    raise LaunchError(self.describe_death(key, proc.returncode, "while starting"))
            if time.monotonic() > deadline:
                late = ", ".join(sorted(waiting))
                raise LaunchError(f"timed out after {START_TIMEOUT_S:g}s waiting for: {late}")
            await registry.wait_changed(0.05)

    def describe_death(self, name: str, returncode: int, when: str = "") -> str:
        pid = self.procs[name].pid
        how = how_it_ended(returncode)
        return f"server '{name}' (pid {pid}) {how}{' ' + when if when else ''}.\n{self.log_tail(name)}"

    def log_tail(self, name: str) -> str:
        return log_tail(self.logs.get(name))

    async def wait_failure(self) -> ServerFailure:
        name = await first_exit(self.procs)
        return ServerFailure(name, self.describe_death(name, self.procs[name].returncode or 0))

    async def stop(self) -> None:
        """SIGTERM everything we started, then SIGKILL what has not exited by the deadline."""
        await stop_processes(list(self.procs.values()), _signal_child)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}


class WorkersBackend(SubprocessBackend):
    """``--workers N``: N copies of the whole inline stack, one process each, one per core.

    One inline stack is one event loop, so it uses one core however many rollouts are in flight.
    A worker is a whole copy of the stack (``polygym.stack.serve`` given every spec), so the calls
    of one rollout stay in-process inside its worker, as in one inline stack. Each worker registers
    its servers as replica ``i`` (registry slots ``name``, ``name[1]``, ..., as the Ray backend's
    replicas), so the collector's client spreads rollouts over the workers by the replicas rule
    (``net.replicas``: least outstanding requests for agents) and nothing else needs to know.

    What a user sees is what one process shows: the same names, every replica in ``gym env
    status``, failures recorded per rollout, ``--resume``. A worker that dies is taken out of the
    registry at once (no new rollout goes to it) and reported like a dead server process, named
    with its pid, its servers and its log tail: ``gym env start`` stops the stack; ``gym eval run``
    lets the other workers go on (``wait_death``), records the rollouts that were cut, and exits
    non-zero when some were, as with a dead replica on Ray.
    """

    name = "workers"

    def __init__(self, workers: int, pool_size: int | None = None) -> None:
        super().__init__(pool_size)
        self.workers = workers
        self._slots: dict[str, list[str]] = {}
        self._servers: tuple[str, ...] = ()
        self._watchers: list[asyncio.Task[None]] = []
        self._deaths: asyncio.Queue[ServerFailure] = asyncio.Queue()

    async def start(
        self, specs: list[ServerSpec], registry: Registry, head_url: str, stack_id: str, secret: str
    ) -> None:
        """Every worker at once, each registering all the servers as its replica; wait for all."""
        self._secret = secret
        self._servers = tuple(spec.name for spec in specs)
        log_dir = stacks.logs_dir(stack_id)
        slots: dict[str, str] = {}
        for index in range(self.workers):
            key = f"worker {index}"
            await self._spawn(key, specs, head_url, log_dir / f"worker-{index}.log", replica=index)
            self._slots[key] = [slot_of({"name": spec.name, "replica": index}) for spec in specs]
            slots.update(dict.fromkeys(self._slots[key], key))
        await self._wait_registered(slots, registry)
        self._watchers = [
            asyncio.create_task(self._unregister_when_dead(key, registry)) for key in self.procs
        ]

    async def _unregister_when_dead(self, key: str, registry: Registry) -> None:
        """Take a dead worker's replicas out of the registry, so that callers stop choosing them,
        and report its death: the servers are down only when no other worker is alive."""
        returncode = await self.procs[key].wait()
        for slot in self._slots[key]:
            registry.remove(slot)
        alive = any(proc.returncode is None for proc in self.procs.values())
        down = () if alive else self._servers
        await self._deaths.put(ServerFailure(key, self.describe_death(key, returncode), down))

    async def wait_death(self) -> ServerFailure:
        return await self._deaths.get()

    async def restart(self, spec: ServerSpec, registry: Registry, head_url: str, stack_id: str) -> None:
        raise LaunchError(
            f"server '{spec.name}' runs in every worker: restart the stack instead "
            "(gym eval run --resume finishes the rollouts that were cut)"
        )

    def describe_death(self, name: str, returncode: int, when: str = "") -> str:
        pid = self.procs[name].pid
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        servers = ", ".join(self._slots.get(name, []))
        return (
            f"{name} (pid {pid}, serving {servers}) {how}{' ' + when if when else ''}.\n{self.log_tail(name)}"
        )

    async def stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        await super().stop()


def make_backend(
    name: str,
    pool_size: int | None,
    config: StackConfig,
    ray_address: str | None,
    replicas: dict[str, int],
    workers: int | None = None,
) -> Backend:
    """The backend called ``name``; Ray is imported only when it is the one chosen.

    Only the Ray backend places several replicas of a server, and only the inline and Ray ones
    run ``--workers`` copies: asking another for them is refused here, naming the option or the
    server, rather than quietly running one copy.
    """
    if name not in BACKENDS:
        raise LaunchError(f"unknown backend '{name}'; choose one of {', '.join(BACKENDS)}")
    if workers is not None and name == "subprocess":
        raise ConfigError(
            [
                "--workers needs --backend inline or ray (each worker is an inline stack); "
                "subprocess runs one process per server"
            ]
        )
    if name == "ray":
        try:
            from polygym.stack.ray_backend import RayBackend
        except ImportError as exc:
            raise ConfigError([f"--backend ray needs Ray: pip install 'polygym[ray]' ({exc})"]) from exc
        if workers is not None:  # what copies cannot honour, refused before a cluster starts
            if replicas:
                raise ConfigError(
                    [
                        "--replicas and --workers do not go together: with --workers every copy holds "
                        "one replica of every server"
                    ]
                )
            copy_placement({n: s.config for n, s in config.servers.items() if s.implementation != EXTERNAL})
        address = config.globals.get("ray_address")
        return RayBackend(pool_size, ray_address, replicas, config_address=address, copies=workers)
    if ray_address:
        raise ConfigError([f"--ray-address needs --backend ray, not {name}"])
    for spec in config.servers.values():
        count = placement_of(spec.name, spec.config, replicas.get(spec.name)).replicas
        if count > 1:
            raise ConfigError(
                [f"server '{spec.name}' asks for {count} replicas: replicas need --backend ray"]
            )
    if workers is not None and workers > 1:
        return WorkersBackend(workers, pool_size)
    return InlineBackend(pool_size) if name == "inline" else SubprocessBackend(pool_size)


def _signal_child(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """Signal one child process; one that has exited meanwhile is not an error."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


class Stack:
    """A running stack: head server + backend + the record other terminals read."""

    def __init__(
        self,
        config: StackConfig,
        backend: str = "inline",
        head_host: str = "127.0.0.1",
        head_port: int | None = None,
        record: bool = True,
        pool_size: int | None = None,
        ray_address: str | None = None,
        replicas: dict[str, int] | None = None,
        workers: int | None = None,
    ) -> None:
        """``pool_size``: the stack's concurrency, which sizes its servers' pools (None: no limit);
        ``ray_address`` and ``replicas`` (``--replicas NAME=N``) are for the Ray backend,
        ``workers`` (``--workers``: copies of the whole stack) for the inline and Ray ones."""
        self.config = config
        self.external = [
            entry
            for spec in config.servers.values()
            if spec.implementation == EXTERNAL
            for entry in external_entries(spec.name, spec.kind, spec.config, spec.source)
        ]
        """Registry entries of the servers someone else runs (``stack.external``), never started."""
        self.backend: Backend = make_backend(backend, pool_size, config, ray_address, replicas or {}, workers)
        self.head_host = head_host
        self.head_port = head_port
        self.record = record
        self.stack_id = stacks.new_stack_id()
        self.registry = Registry()
        self.secret = secrets.token_urlsafe(SECRET_BYTES)
        """Proves a registration comes from this stack's own processes; never printed or recorded."""
        self.head: AppServer | None = None
        self.started_in_s = 0.0
        specs = list(config.servers.values())
        self.nemo_gym = NemoGymServers([s for s in specs if is_nemo_gym_server(s)])
        """NeMo Gym's own servers, run beside the backend's as NeMo Gym runs them (``nemo_gym_server``)."""
        self._own_specs = [s for s in specs if s not in self.nemo_gym.specs and s.implementation != EXTERNAL]
        """The servers the backend places: neither NeMo Gym's nor someone else's (external)."""

    @property
    def head_url(self) -> str:
        assert self.head is not None
        return self.head.url

    def _bind_head(self) -> Any:
        """The requested port, or DEFAULT_HEAD_PORT falling back to any free port if taken."""
        if self.head_port is not None:
            try:
                return bind_socket(self.head_host, self.head_port)
            except PortInUseError as exc:
                raise LaunchError(f"head server: {exc}; pick another --head-port or 0 for any") from exc
        try:
            return bind_socket(self.head_host, DEFAULT_HEAD_PORT)
        except PortInUseError:
            return bind_socket(self.head_host, 0)

    async def start(self) -> None:
        """Start head then every server; on any failure, stop what started and raise."""
        began = time.perf_counter()
        public_config = self.config.to_dict(mask_secrets=True)
        head = head_app(self.registry, public_config, self.stack_id, self.secret, self.config.relays)
        self.head = AppServer(head, self._bind_head())
        await self.head.start()
        for entry in self.external:
            self.registry.register(entry)
        try:
            await self.backend.start(
                self._own_specs, self.registry, self.head_url, self.stack_id, self.secret
            )
            if self.nemo_gym.specs:  # after polygym's: their addresses go into NeMo Gym's config
                await self.nemo_gym.start(self.config, self.registry, self.head_url, self.stack_id)
        except BaseException:
            await self.stop()
            raise
        self.started_in_s = time.perf_counter() - began
        if self.record:
            stacks.write_stack(self.describe())

    def servers(self) -> list[dict[str, Any]]:
        """Every registered replica, in config order, then replica order."""
        order = {name: i for i, name in enumerate(self.config.servers)}
        entries = [e for e in self.registry.entries.values() if e["name"] in order]
        return sorted(entries, key=lambda e: (order[e["name"]], int(e.get("replica") or 0)))

    def describe(self) -> dict[str, Any]:
        proc = psutil.Process()
        return {
            "stack_id": self.stack_id,
            "pid": os.getpid(),
            "process_started_at": proc.create_time(),
            "started_at": time.time(),
            "head_url": self.head_url,
            "backend": self.backend.name,
            "servers": self.servers(),
            "log_dir": str(stacks.state_dir() / "logs" / self.stack_id),
        }

    @property
    def client(self) -> ServerClient | None:
        """The in-process client when servers run inline (calls bypass sockets)."""
        return self.backend.client if isinstance(self.backend, InlineBackend) else None

    async def wait_failure(self) -> ServerFailure:
        if not self.nemo_gym.specs:
            return await self.backend.wait_failure()
        waits = [
            asyncio.ensure_future(self.backend.wait_failure()),
            asyncio.ensure_future(self.nemo_gym.wait_failure()),
        ]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return next(iter(done)).result()

    async def restart(self, name: str) -> None:
        """Restart one dead server of a subprocess stack (the others keep running)."""
        if not isinstance(self.backend, SubprocessBackend):
            raise LaunchError(f"restarting a server needs the subprocess backend, not {self.backend.name}")
        await self.backend.restart(self.config.servers[name], self.registry, self.head_url, self.stack_id)
        if self.record:
            stacks.write_stack(self.describe())

    async def stop(self) -> None:
        try:
            await self.nemo_gym.stop()
            await self.backend.stop()
        finally:
            if self.head is not None:
                await self.head.stop()
            if self.record:
                stacks.remove_stack(self.stack_id)
