"""The Ray backend: one Ray actor per server replica, each serving the unchanged ASGI app over HTTP.

Why actors and not Ray Serve: Serve's proxy adds a hop (~10 ms) to every tool call and has no
session affinity, and per-rollout state must stay in the replica that seeded it. Here each actor
binds its own port (port 0, on its node's address), serves the app with the same uvicorn server as
the other backends, and hands its address back to the launcher, which registers it with the head
server in its own process (``registered_by: launcher``): the stack secret never leaves the
launcher, and servers never learn how they were placed. Rollouts never pass through the object
store; HTTP stays the protocol, and ``ServerClient`` picks a replica per call (``net.replicas``).

Placement comes from each server's config (``stack.placement``): ``replicas``, ``num_cpus``,
``num_gpus``, custom ``resources`` and ``max_restarts``. Resources-server replicas take the nodes
that can hold them in turn (``stack.ray_spread``), so one node's loss takes only part of an
environment with it; the replicas of a server with ``num_gpus`` run in a placement group
(``stack.ray_gpu_groups``). A server no node could hold is refused at once, by name.

A replica that dies is named (server, replica, node, the tail of its log, and whether Ray restarts
it), taken out of the registry once Ray reports the death (about a second; until then callers pass
it over when it refuses them, ``net.replicas``), and restarted by Ray up to ``max_restarts``
times; the launcher then starts the server in the restarted actor and registers its new address.
A rollout cut on the dead replica is sent again to another by the collector's retries; one that
still fails is recorded with the transport's class (``ConnectionReset``, ``ConnectionRefused``)
and ``--resume`` runs it again. Every death is reported
through ``wait_death`` (``gym eval run`` names it, and exits 1 when rollouts were lost); one that
leaves a server with no replica (past its restarts, no other replica serving) also through
``wait_failure``, like a dead process of the subprocess backend.

The cluster: ``ray_address`` (``--ray-address``, ``RAY_ADDRESS``, config ``ray_address``) joins an
existing one; without it a local cluster is started on this machine and shut down with the stack.
Every node must have polygym and the servers' packages installed (on KubeRay: in the image). A
local cluster, and one joined at a loopback address, stays on 127.0.0.1 (``connect_cluster``), and
each replica listens on the address its node has in the cluster. An address where nothing answers,
or where something that is not gRPC answers, is refused within ``CONNECT_TIMEOUT_S``, naming where
it came from: Ray itself would retry for about 14 minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray._private import ray_constants
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup

from polygym.gc_pace import pace_for_rollouts
from polygym.kinds import RESOURCES_KIND
from polygym.net.listen import AppServer
from polygym.net.replicas import slot_of
from polygym.stack import ray_gpu_groups as gpu_groups
from polygym.stack import records as stacks
from polygym.stack.backend import (
    LOG_TAIL_LINES,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    LaunchError,
    ServerFailure,
    spec_from_dict,
    spec_to_dict,
    stack_client,
)
from polygym.stack.config import ConfigError
from polygym.stack.head import Registry
from polygym.stack.loader import serve_in_process
from polygym.stack.placement import Placement, copy_placement, placement_of
from polygym.stack.ray_spread import NodeTurns, placeable_nodes, schedulable
from polygym.stack.server_spec import ServerSpec

RESTART_POLL_S = 0.2
CONNECT_TIMEOUT_S = 10.0
"""How long a cluster address may take to accept a connection before it is refused."""
LOOPBACK = "127.0.0.1"
JOIN_ANY = ("auto", "local")
"""Ray's own address words (find the cluster on this machine; start one): nothing to check."""


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (``host:port``, perhaps ``ray://``) is on this machine's loopback;
    None, a cluster of our own, is."""
    if address is None:
        return True
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _loopback_kept() -> Iterator[None]:
    """Keep Ray on loopback while this process starts or joins a loopback cluster.

    Ray turns a loopback address (the node's, the cluster's) into this machine's network address
    before using it (``services.resolve_ip_for_localhost``), unless multi-host clusters are off:
    ``ray.init(_node_ip_address="127.0.0.1")`` alone still listens on the network, and joining a
    cluster that listens on 127.0.0.1 dials the network address and hangs. The switch is Ray's
    constant (read when Ray was imported, hence set here too) and its environment variable (which
    the processes Ray starts now inherit); both are restored after.
    """
    env = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved_flag = os.environ.get(env), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[env] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = saved_env


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""A client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5)."""
SETTINGS_FRAME = 4


def check_reachable(address: str, source: str) -> None:
    """A ConfigError naming ``source`` unless a Ray cluster could answer at ``address``.

    Nothing accepting the connection in time is one error. A port that accepts it but does not
    speak gRPC (a web server, the dashboard's 8265 given for the GCS's 6379) is the other: Ray
    would retry it for about 14 minutes (20 tries of ~41 s) before failing. Ray's GCS and its
    client server (``ray://``) are gRPC servers, and an HTTP/2 server's first frame is SETTINGS,
    so one round trip tells them apart. With ``RAY_USE_TLS`` the GCS expects a TLS handshake
    first, and only the connection is checked.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError([f"{source} {address!r}: expected HOST:PORT of a Ray cluster"])
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            [f"{source} {address}: no Ray cluster answers there within {CONNECT_TIMEOUT_S:g}s ({reason})"]
        ) from None
    with sock:
        if _tls_on():
            return
        first, problem = _first_frame(sock)
    if len(first) == 9 and first[3] == SETTINGS_FRAME:
        return
    heard = f"it answered {first[:40]!r}" if first else problem or "it closed the connection without a word"
    if first[:1] in (b"\x15", b"\x16"):
        heard += ": a TLS record; if the cluster uses TLS, set RAY_USE_TLS=1"
    raise ConfigError(
        [
            f"{source} {address}: something listens there but it is not a Ray cluster ({heard}, "
            "not gRPC); give the address of the head's GCS (port 6379 by default), or "
            "ray://HOST:10001 for Ray Client"
        ]
    )


def _first_frame(sock: socket.socket) -> tuple[bytes, str]:
    """What the server at ``sock`` answers to an HTTP/2 preface, up to one frame header (9 bytes),
    and why it stopped short: the connection failed, or no reply came within the timeout."""
    received = b""
    try:
        sock.sendall(HTTP2_PREFACE)
        while len(received) < 9:
            chunk = sock.recv(9 - len(received))
            if not chunk:
                return received, ""
            received += chunk
    except TimeoutError:
        return received, f"no reply to an HTTP/2 preface within {CONNECT_TIMEOUT_S:g}s"
    except OSError as exc:
        return received, f"the connection failed after it opened: {exc.strerror or type(exc).__name__}"
    return received, ""


def _tls_on() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep this process's SIGTERM handling across ``ray.init``.

    ``ray.init`` replaces it with a handler that raises ``SystemExit`` wherever the loop is, and
    Ray's native logging adds one that prints a stack dump ("*** SIGTERM received ***"): ``gym env
    stop`` then printed Ray's traceback and the launcher could end ``Aborted`` (134) instead of
    stopping its stack and printing one line. Setting the saved handler again (Python's own, which
    the event loop's signal handling rides on) removes both.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if saved is not None:
            signal.signal(signal.SIGTERM, saved)


def connect_cluster(address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local one when None; True when started here."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_kept())
        if is_loopback(address):
            stack.enter_context(_loopback_kept())
        if address:
            ray.init(address=address, log_to_driver=False)
            return False
        # "local": a new cluster, even where one runs already (None would join that one).
        ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)
        return True


def node_address() -> str:
    """The address this actor's node has in the cluster (what the other nodes reach it at).

    Not ``ray.util.get_node_ip_address()``: in a worker process that guesses from the default
    route, which is the network address even on a node of a loopback cluster.
    """
    node_id = ray.get_runtime_context().get_node_id()
    return str(next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id))


class ReplicaHost:
    """The body of one replica's actor: builds its servers (one, or a whole copy of the stack),
    serves each on its own socket, stops them when told. The servers of one actor share one
    client, so the calls between them stay in-process, as in an inline stack."""

    def __init__(self) -> None:
        self._servers: list[AppServer] = []
        self._client: Any = None

    async def start(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Build and serve the servers of ``payload``; returns where each one listens."""
        _log_to(Path(payload["log_path"]))
        pace_for_rollouts()
        specs = [spec_from_dict(spec) for spec in payload["specs"]]
        self._client = stack_client(payload["head_url"], payload.get("pool_size"))
        host = payload.get("bind_host") or node_address()
        urls = {}
        for spec, app_server in await serve_in_process(specs, self._client, host):
            self._servers.append(app_server)
            urls[spec.name] = app_server.url
            logging.getLogger("polygym.stack.ray").info(
                "%s replica %s serving on %s", spec.name, payload["replica"], app_server.url
            )
        return {
            "urls": urls,
            "pid": os.getpid(),
            "node_ip": host,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def serving(self) -> None:
        """Return when a server stops; an actor that dies makes this call raise instead."""
        tasks = [asyncio.ensure_future(s.task) for s in self._servers if s.task is not None]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self._servers), return_exceptions=True)
        if self._client is not None:
            await self._client.close()


def _log_to(path: Path) -> None:
    """The replica's log, on its node, so a death can be shown with its last lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def cluster_address(option: str | None, config: str | None) -> tuple[str | None, str]:
    """The cluster to join and where it was given: the option, else the config, else ``RAY_ADDRESS``."""
    for address, source in (
        (option, "--ray-address"),
        (config, "ray_address (config)"),
        (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
    ):
        if address:
            return address, source
    return None, ""


@dataclass
class Replica:
    """One actor: replica ``index`` of one server, or copy ``index`` of the whole stack."""

    specs: list[ServerSpec]
    index: int
    actor: Any
    payload: dict[str, Any]
    max_restarts: int
    whole_stack: bool = False
    """A copy of the whole stack (``--workers``), however many servers the stack has."""
    restarts: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)
    """Its registry entries, one per server, once it serves."""

    @property
    def name(self) -> str:
        """What a death is reported under: the server, or the copy."""
        return f"copy {self.index}" if self.whole_stack else self.specs[0].name

    @property
    def label(self) -> str:
        if not self.whole_stack:
            return f"server '{self.name}' replica {self.index}"
        return f"{self.name} of the stack (serving {', '.join(spec.name for spec in self.specs)})"


class RayBackend:
    """Server replicas as Ray actors on a local or joined cluster (see the module docstring)."""

    name = "ray"

    def __init__(
        self,
        pool_size: int | None = None,
        ray_address: str | None = None,
        replicas: dict[str, int] | None = None,
        bind_host: str | None = None,
        config_address: str | None = None,
        copies: int | None = None,
    ) -> None:
        """``ray_address``: ``--ray-address``, before the config's ``config_address`` and
        ``RAY_ADDRESS``; ``bind_host``: the address replicas listen on (None: their node's);
        ``copies`` (``--workers N``): N actors each serving the whole stack, instead of one
        actor per server replica."""
        self.copies = copies
        self.pool_size = pool_size
        self.ray_address, source = cluster_address(ray_address, config_address)
        if self.ray_address and self.ray_address not in JOIN_ANY and not ray.is_initialized():
            check_reachable(self.ray_address, source)
        self.replica_overrides = replicas or {}
        self.bind_host = bind_host
        self.replicas: list[Replica] = []
        self.groups: dict[str, PlacementGroup] = {}
        """Each GPU server's placement group (``stack.ray_gpu_groups``), by server name."""
        self._turns = NodeTurns()
        self._host: Any = None
        """``ReplicaHost`` as a Ray actor class, made once per start (Ray exports each one)."""
        self._started_ray = False
        self._deaths: asyncio.Queue[ServerFailure] = asyncio.Queue()
        self._watchers: list[asyncio.Task[None]] = []
        self._registry: Registry | None = None

    def _connect(self) -> None:
        if not ray.is_initialized():
            self._started_ray = connect_cluster(self.ray_address)

    async def start(
        self, specs: list[ServerSpec], registry: Registry, head_url: str, stack_id: str, secret: str
    ) -> None:
        """One actor per replica, all started together; registered once each one serves."""
        self._registry = registry
        self._connect()
        self._host = ray.remote(ReplicaHost)
        log_dir = stacks.logs_dir(stack_id)
        if self.copies is not None:
            self._plan_copies(specs, self.copies, head_url, log_dir)
        else:
            for spec in specs:
                await self._plan_replicas(spec, head_url, log_dir)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                places = await asyncio.gather(*(r.actor.start.remote(r.payload) for r in self.replicas))
        except TimeoutError:
            raise LaunchError(
                f"timed out after {START_TIMEOUT_S:g}s waiting for the Ray replicas to serve"
            ) from None
        except RayActorError as exc:
            raise LaunchError(f"a Ray replica died while starting: {exc}") from exc
        for replica, place in zip(self.replicas, places, strict=True):
            self._register(replica, place)
        self._watchers = [asyncio.create_task(self._watch(r)) for r in self.replicas]

    async def _plan_replicas(self, spec: ServerSpec, head_url: str, log_dir: Path) -> None:
        """One actor per replica of ``spec``, placed by its config (see the module docstring)."""
        placement = placement_of(spec.name, spec.config, self.replica_overrides.get(spec.name))
        if spec.kind == RESOURCES_KIND:
            placement = schedulable(placement)
        nodes = placeable_nodes(f"server '{spec.name}'", placement)
        group = await self._group_for(spec.name, placement)
        for index in range(placement.replicas):
            where = self._where(spec, group, index, nodes)
            log_path = log_dir / f"{spec.name}.{index}.log"
            self._add_actor([spec], index, placement, where, head_url, log_path)

    def _plan_copies(self, specs: list[ServerSpec], copies: int, head_url: str, log_dir: Path) -> None:
        """``copies`` actors, each serving every server, taking the nodes in turn."""
        placement = schedulable(copy_placement({spec.name: spec.config for spec in specs}))
        nodes = placeable_nodes("a copy of the stack", placement)
        for index in range(copies):
            where = self._turns.strategy(nodes)
            self._add_actor(specs, index, placement, where, head_url, log_dir / f"copy-{index}.log")

    def _add_actor(
        self,
        specs: list[ServerSpec],
        index: int,
        placement: Placement,
        where: dict[str, Any],
        head_url: str,
        log_path: Path,
    ) -> None:
        actor = self._host.options(
            num_cpus=placement.num_cpus,
            num_gpus=placement.num_gpus,
            resources=placement.resources or None,
            max_restarts=placement.max_restarts,
            max_task_retries=0,
            **where,
        ).remote()
        payload = {
            "specs": [spec_to_dict(spec) for spec in specs],
            "head_url": head_url,
            "pool_size": self.pool_size,
            "replica": index,
            "bind_host": self.bind_host,
            "log_path": str(log_path),
        }
        self.replicas.append(
            Replica(specs, index, actor, payload, placement.max_restarts, whole_stack=self.copies is not None)
        )

    async def _group_for(self, name: str, placement: Placement) -> PlacementGroup | None:
        """The placement group of a GPU server's replicas, reserved now; None for other servers."""
        if not gpu_groups.needs_group(placement):
            return None
        self.groups[name] = await gpu_groups.reserve(name, placement)
        return self.groups[name]

    def _where(
        self, spec: ServerSpec, group: PlacementGroup | None, index: int, nodes: list[str]
    ) -> dict[str, Any]:
        """Where replica ``index`` runs: its bundle of ``group``; else a resources server's replicas
        take ``nodes`` in turn (``stack.ray_spread``), and other servers go where Ray puts them."""
        if group is not None:
            return gpu_groups.in_bundle(group, index)
        if spec.kind == RESOURCES_KIND:
            return self._turns.strategy(nodes)
        return {"scheduling_strategy": "DEFAULT"}

    def _register(self, replica: Replica, place: dict[str, Any]) -> None:
        assert self._registry is not None
        urls = place.pop("urls")
        replica.entries = [
            {
                "name": spec.name,
                "kind": spec.kind,
                "implementation": spec.implementation,
                "replica": replica.index,
                "restarts": replica.restarts,
                "pool_size": self.pool_size,
                "url": urls[spec.name],
                **place,
            }
            for spec in replica.specs
        ]
        for entry in replica.entries:
            self._registry.register(entry)

    async def _watch(self, replica: Replica) -> None:
        """Wait for the replica to die; take it out, report it, restart it within its bound."""
        while True:
            try:
                await replica.actor.serving.remote()
                return  # stopped on purpose
            except RayActorError:
                pass
            assert self._registry is not None
            for entry in replica.entries:
                self._registry.remove(slot_of(entry))
            death = self.describe_death(replica)
            logging.getLogger("polygym.stack.ray").warning("%s", death)
            if replica.restarts < replica.max_restarts:
                await self._deaths.put(ServerFailure(replica.name, death, down=()))
                if await self._restart(replica):
                    logging.getLogger("polygym.stack.ray").warning(
                        "%s serves again (restart %d of %d)",
                        replica.label,
                        replica.restarts,
                        replica.max_restarts,
                    )
                    continue
                death = f"{replica.label} did not serve again within {START_TIMEOUT_S:g}s of its restart"
            await self._deaths.put(ServerFailure(replica.name, death, self._down_without(replica)))
            return

    def _down_without(self, replica: Replica) -> tuple[str, ...]:
        """The servers of a replica gone for good that no other replica still serves."""
        assert self._registry is not None
        serving = {e["name"] for e in self._registry.entries.values()}
        return tuple(spec.name for spec in replica.specs if spec.name not in serving)

    async def _restart(self, replica: Replica) -> bool:
        """Start the server again in the actor Ray restarted; False when it does not come back."""
        replica.restarts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                place = await replica.actor.start.remote(replica.payload)
            except RayActorError:
                await asyncio.sleep(RESTART_POLL_S)
                continue
            self._register(replica, place)
            return True
        return False

    def describe_death(self, replica: Replica) -> str:
        entry = replica.entries[0] if replica.entries else {}
        node = f"{entry.get('node_ip', '?')} ({str(entry.get('node_id', '?'))[:12]})"
        where = f"node {node}, pid {entry.get('pid', '?')}"
        return f"{replica.label} on {where} died; {self._fate(replica)}.\n{self.log_tail(replica)}"

    @staticmethod
    def _fate(replica: Replica) -> str:
        """What happens to a replica that just died, said as it is: Ray restarts it (which one of
        how many), or it stays down and why."""
        if replica.restarts < replica.max_restarts:
            return f"Ray restarts it (restart {replica.restarts + 1} of {replica.max_restarts})"
        if replica.max_restarts == 0:
            return "it is not restarted (max_restarts: 0)"
        return f"it is not restarted (all {replica.max_restarts} restarts used)"

    @staticmethod
    def log_tail(replica: Replica) -> str:
        path = Path(replica.payload["log_path"])
        try:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            return f"  (its log {path} is on its node)"
        body = "\n".join(f"    {line}" for line in lines) or "    (log is empty)"
        return f"  last lines of {path}:\n{body}"

    async def wait_death(self) -> ServerFailure:
        return await self._deaths.get()

    async def wait_failure(self) -> ServerFailure:
        """The first death that leaves a server with no replica (``wait_death`` has them all)."""
        while not (failure := await self._deaths.get()).servers_down:
            pass
        return failure

    def pids(self) -> dict[str, int]:
        """Each serving replica's process (by registry slot), for CPU and memory accounting."""
        return {slot_of(e): int(e["pid"]) for r in self.replicas for e in r.entries}

    async def stop(self) -> None:
        """Drain each replica (bounded), then kill every actor; a local cluster goes too."""
        for task in self._watchers:
            task.cancel()
        if self.replicas:
            with contextlib.suppress(TimeoutError, RayActorError):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await asyncio.gather(
                        *(r.actor.stop.remote() for r in self.replicas), return_exceptions=True
                    )
            for replica in self.replicas:
                with contextlib.suppress(Exception):
                    ray.kill(replica.actor, no_restart=True)
            self.replicas.clear()
        gpu_groups.release(list(self.groups.values()))
        self.groups.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
